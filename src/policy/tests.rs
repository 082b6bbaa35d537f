//! Table and property tests of the policy (docs/SPEC.md §3–§4): one row per cell of the §3 table, one test
//! per bullet, one per step of §4, and proptest invariants.
//!
//! Long on purpose: the policy tables, cell by cell (§3, §4, §7), in one place.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use nix::errno::Errno;
use proptest::prelude::*;

use super::*;
use crate::identity::Identity;
use crate::tree::model::SmithIdx;

// The fixture tree. X is smith-002 at level 2; P(X) is smith-001; the root is X's grandparent.
const ROOT: SmithIdx = SmithIdx(0);
const P: SmithIdx = SmithIdx(1);
const X: SmithIdx = SmithIdx(2);
const CHILD: SmithIdx = SmithIdx(3); // a child of X
const SIBLING: SmithIdx = SmithIdx(4); // another child of P
const COUSIN: SmithIdx = SmithIdx(5); // smith-root/smith-002, a sibling of P

fn names(s: SmithIdx) -> Option<crate::tree::model::FullId> {
    let full = match s.0 {
        0 => "smith-root",
        1 => "smith-root/smith-001",
        2 => "smith-root/smith-001/smith-002",
        3 => "smith-root/smith-001/smith-002/smith-001",
        4 => "smith-root/smith-001/smith-003",
        5 => "smith-root/smith-002",
        _ => return None,
    };
    crate::tree::model::FullId::parse(full)
}

fn ctx(operator: OperatorMode) -> Ctx<'static> {
    Ctx {
        operator,
        root: Some(ROOT),
        limits: Limits::default(),
        project: true,
        names: &names,
    }
}

fn rw() -> Ctx<'static> {
    ctx(OperatorMode::ReadWrite)
}

fn zone_of(owner: SmithIdx, area: Area, depth: Depth) -> Zone {
    let (parent, level) = match owner.0 {
        0 => (None, 0),
        1 | 5 => (Some(ROOT), 1),
        2 | 4 => (Some(P), 2),
        3 => (Some(X), 3),
        _ => unreachable!(),
    };
    Zone::Smith(SmithZone {
        owner,
        owner_parent: parent,
        owner_level: level,
        area,
        depth,
    })
}

fn x(area: Area, depth: Depth) -> Zone {
    zone_of(X, area, depth)
}

fn out(area: RootArea, depth: Depth) -> Zone {
    Zone::Outside { area, depth }
}

const LIVE_UNLINK: Op = Op::Delete {
    how: Removal::Unlink,
    subtree_live: true,
};
const IDLE_UNLINK: Op = Op::Delete {
    how: Removal::Unlink,
    subtree_live: false,
};

/// The probe ops of the four classes, in `rwcd` order. Delete is probed with a live run in the subtree.
const CLASSES: [Op; 4] = [Op::Read, Op::Write, Op::Create(NewKind::File), LIVE_UNLINK];

/// Other ops that must be judged exactly like the class probe at the same index.
fn same_as(i: usize) -> Vec<Op> {
    match i {
        0 | 1 => vec![],
        2 => vec![
            Op::Create(NewKind::Dir),
            Op::Create(NewKind::Symlink),
            Op::Create(NewKind::Fifo),
            Op::Create(NewKind::Socket),
        ],
        _ => vec![Op::Delete {
            how: Removal::Rmdir,
            subtree_live: true,
        }],
    }
}

/// `r`/`w`/`c`/`d` allowed, `-` EACCES, `P` EPERM, `B` EBUSY.
fn expect(cell: &str, id: Identity, zone: Zone, ctx: &Ctx<'_>, row: &str) {
    assert_eq!(cell.len(), 4, "{row}: cell {cell:?}");
    for (i, ch) in cell.chars().enumerate() {
        let want = match ch {
            'r' | 'w' | 'c' | 'd' => None,
            '-' => Some(Errno::EACCES),
            'P' => Some(Errno::EPERM),
            'B' => Some(Errno::EBUSY),
            other => panic!("bad cell char {other}"),
        };
        for op in std::iter::once(CLASSES[i]).chain(same_as(i)) {
            let got = match decide(&id, op, &zone, ctx) {
                Decision::Allow => None,
                Decision::Deny(d) => {
                    assert!(!d.why.is_empty() && !d.alternative.is_empty());
                    Some(d.errno)
                }
            };
            assert_eq!(got, want, "{row}: {id:?} {op:?} (cell {cell})");
            for cheap in [Op::Lookup, Op::Getattr, Op::Statfs] {
                assert!(decide(&id, cheap, &zone, ctx).is_allowed());
            }
        }
    }
}

/// docs/SPEC.md §3, one row per table row; each cell: X, P(X), other smiths (a child of X, the
/// grandparent, a sibling, a cousin), operator, Unknown.
#[test]
fn section_3_table_every_cell() {
    use Area as A;
    use Depth::{Inner, Top};
    #[rustfmt::skip]
    let rows: &[(&str, Zone, &str, &str, &str, &str)] = &[
        //  where                        zone                          X       P(X)    others  operator
        ("smith.md",                     x(A::SmithMd, Top),           "r-PP", "r-PP", "--PP", "rwPB"),
        ("config.json",                  x(A::Config, Top),            "r---", "rwcd", "----", "rwcd"),
        (".claude/**",                   x(A::Claude, Inner),          "r---", "rwcd", "----", "rwcd"),
        ("inbox/**",                     x(A::Inbox, Inner),           "r---", "rwcd", "----", "rwcd"),
        ("private/**",                   x(A::Private, Inner),         "rwcd", "----", "----", "rwcd"),
        ("other name (CLAUDE.md)",       x(A::Other, Top),             "rwcd", "----", "----", "rwcd"),
        ("other name inside (.git/x)",   x(A::Other, Inner),           "rwcd", "----", "----", "rwcd"),
        ("outbox/**",                    x(A::Outbox, Inner),          "rwcd", "r---", "----", "rwcd"),
        ("workspace/** (§11)",           x(A::Workspace, Inner),       "rwcd", "r---", "----", "rwcd"),
        ("home/** (§12)",                x(A::Home, Inner),            "rwcd", "----", "----", "rwcd"),
        ("conversations/**",             x(A::Conversations, Inner),   "r---", "r---", "----", "r--B"),
        ("children/ (the directory)",    x(A::Children, Top),          "r-PP", "r-PP", "r-PP", "r-PB"),
        ("children/unregistered",        x(A::Children, Inner),        "r-P-", "r---", "r---", "rwPd"),
        ("the smith dir itself",         x(A::SmithDir, Top),          "r-PP", "r-PP", "r-PP", "r-PB"),
        // Area directories: listed under the area's read right, changed under its write right.
        (".claude/",                     x(A::Claude, Top),            "r-PP", "rwPP", "--PP", "rwPB"),
        ("inbox/",                       x(A::Inbox, Top),             "r-PP", "rwPP", "--PP", "rwPB"),
        ("private/",                     x(A::Private, Top),           "rwPP", "--PP", "--PP", "rwPB"),
        ("outbox/",                      x(A::Outbox, Top),            "rwPP", "r-PP", "--PP", "rwPB"),
        ("workspace/ (§11)",             x(A::Workspace, Top),         "rwPP", "r-PP", "--PP", "rwPB"),
        ("home/ (§12)",                  x(A::Home, Top),              "rwPP", "--PP", "--PP", "rwPB"),
        ("conversations/",               x(A::Conversations, Top),     "r-PP", "r-PP", "--PP", "r-PB"),
    ];
    let c = rw();
    for &(row, zone, cx, cp, cother, cop) in rows {
        expect(cx, Identity::Smith(X), zone, &c, row);
        expect(cp, Identity::Smith(P), zone, &c, row);
        for other in [CHILD, ROOT, SIBLING, COUSIN] {
            expect(cother, Identity::Smith(other), zone, &c, row);
        }
        expect(cop, Identity::Operator, zone, &c, row);
        expect("----", Identity::Unknown, zone, &c, row);
        // The rights summary agrees with the table for ordinary (non-structure) cells.
        if !zone.is_structure() {
            let summary = rights(&Identity::Smith(X), &zone, &c).to_string();
            assert_eq!(summary, cx.replace(['P', 'B'], "-"), "{row}: whoami rights");
        }
    }
}

/// docs/SPEC.md §3, §11: without a project, `workspace` is an ordinary top-level name of the smith
/// dir (the owner's; not structure, no parent read).
#[test]
fn workspace_without_a_project_is_an_ordinary_name() {
    use Area as A;
    use Depth::{Inner, Top};
    let c = Ctx {
        project: false,
        ..rw()
    };
    for (row, zone) in [
        ("workspace", x(A::Workspace, Top)),
        ("workspace/**", x(A::Workspace, Inner)),
    ] {
        expect("rwcd", Identity::Smith(X), zone, &c, row);
        expect("----", Identity::Smith(P), zone, &c, row);
        expect("----", Identity::Smith(SIBLING), zone, &c, row);
        expect("rwcd", Identity::Operator, zone, &c, row);
    }
    // With one, another smith's write is refused with the workspace rule.
    let d = deny(decide(
        &Identity::Smith(SIBLING),
        Op::Write,
        &x(A::Workspace, Inner),
        &rw(),
    ));
    assert_eq!((d.errno, d.rule), (Errno::EACCES, "workspace-owner-writes"));
    let d = deny(decide(
        &Identity::Smith(X),
        Op::Write,
        &out(RootArea::Project, Inner),
        &rw(),
    ));
    assert_eq!(
        (d.errno, d.rule),
        (Errno::EACCES, "project-operator-writes")
    );
    assert!(d.why.contains("project.git/"), "{}", d.why);
}

/// docs/SPEC.md §3, outside `smiths/`: smiths read; the root smith also writes and creates in results/;
/// the operator may do all. Columns: root smith, another smith, operator (Unknown: nothing).
#[test]
fn section_3_outside_smiths() {
    use Depth::{Inner, Top};
    use RootArea as R;
    #[rustfmt::skip]
    let rows: &[(&str, Zone, &str, &str, &str)] = &[
        //  where                   zone                        root    smith   operator
        ("mount root",              out(R::MountRoot, Top),     "r-PP", "r-PP", "rwPP"),
        ("config.json",             out(R::Config, Top),        "r---", "r---", "rwcd"),
        ("templates/",              out(R::Templates, Top),     "r---", "r---", "rwcd"),
        ("templates/**",            out(R::Templates, Inner),   "r---", "r---", "rwcd"),
        ("templates/home (§12)",    out(R::TemplatesHome, Top), "----", "----", "rwcd"),
        ("templates/home/** (§12)", out(R::TemplatesHome, Inner), "----", "----", "rwcd"),
        ("agents/**",               out(R::Agents, Inner),      "r---", "r---", "rwcd"),
        ("results/",                out(R::Results, Top),       "r---", "r---", "rwcd"),
        ("results/**",              out(R::Results, Inner),     "rwc-", "r---", "rwcd"),
        ("project.git/ (§11)",      out(R::Project, Top),       "r---", "r---", "rwcd"),
        ("project.git/** (§11)",    out(R::Project, Inner),     "r---", "r---", "rwcd"),
        ("smiths/",                 out(R::Smiths, Top),        "r-PP", "r-PP", "rwPP"),
        ("smiths/unregistered",     out(R::Smiths, Inner),      "r-P-", "r-P-", "rwPd"),
        ("other root-level name",   out(R::Other, Top),         "r---", "r---", "rwcd"),
        ("other root-level inner",  out(R::Other, Inner),       "r---", "r---", "rwcd"),
        (".smithfs/",               out(R::Control, Top),       "r-PP", "r-PP", "r-PP"),
        (".smithfs/why",            out(R::Control, Inner),     "r-PP", "r-PP", "r-PP"),
        (".smithfs/ctl",            out(R::ControlCtl, Top),    "rwPP", "rwPP", "rwPP"),
        (".smithfs-state",          out(R::Reserved, Top),      "PPPP", "PPPP", "PPPP"),
    ];
    let c = rw();
    for &(row, zone, croot, csmith, cop) in rows {
        expect(croot, Identity::Smith(ROOT), zone, &c, row);
        for s in [P, X, CHILD, COUSIN] {
            expect(csmith, Identity::Smith(s), zone, &c, row);
        }
        expect(cop, Identity::Operator, zone, &c, row);
        expect("----", Identity::Unknown, zone, &c, row);
    }
    // Without a root smith nobody writes results/ but the operator.
    let none = Ctx { root: None, ..rw() };
    expect(
        "r---",
        Identity::Smith(ROOT),
        out(R::Results, Inner),
        &none,
        "results/** without a root",
    );
}

/// docs/SPEC.md §3, operator mode `read-only`: read everything, write only `smiths/smith-root/inbox/**`,
/// `config.json` and `.smithfs/ctl`.
#[test]
fn operator_read_only() {
    use Area as A;
    use Depth::{Inner, Top};
    use RootArea as R;
    let c = ctx(OperatorMode::ReadOnly);
    #[rustfmt::skip]
    let rows: &[(&str, Zone, &str)] = &[
        ("smith-root/inbox/**",   zone_of(ROOT, A::Inbox, Inner),        "rwcd"),
        ("smith-root/inbox/",     zone_of(ROOT, A::Inbox, Top),          "r-P-"),
        ("X's inbox/**",          x(A::Inbox, Inner),                    "r---"),
        ("smith-root/private/**", zone_of(ROOT, A::Private, Inner),      "r---"),
        ("smith.md",              x(A::SmithMd, Top),                    "r-P-"),
        ("smith dir",             x(A::SmithDir, Top),                   "r-P-"),
        ("conversations/**",      x(A::Conversations, Inner),            "r---"),
        ("config.json",           out(R::Config, Top),                   "rw--"),
        ("results/**",            out(R::Results, Inner),                "r---"),
        ("mount root",            out(R::MountRoot, Top),                "r-PP"),
        (".smithfs/ctl",          out(R::ControlCtl, Top),               "rwPP"),
        (".smithfs/why",          out(R::Control, Inner),                "r-PP"),
    ];
    for &(row, zone, cell) in rows {
        expect(cell, Identity::Operator, zone, &c, row);
    }
    // Smiths are not affected by the operator's mode.
    expect(
        "rwcd",
        Identity::Smith(X),
        x(A::Private, Inner),
        &c,
        "X's private/** (read-only operator)",
    );
    let d = deny(decide(
        &Identity::Operator,
        Op::Write,
        &x(A::Private, Inner),
        &c,
    ));
    assert_eq!(d.rule, "operator-read-only");
    // Removing an idle smith dir is a write: refused in read-only mode.
    let d = deny(decide(
        &Identity::Operator,
        IDLE_UNLINK,
        &x(A::SmithDir, Top),
        &c,
    ));
    assert_eq!((d.errno, d.rule), (Errno::EACCES, "operator-read-only"));
}

fn deny(d: Decision) -> Denial {
    match d {
        Decision::Deny(d) => d,
        Decision::Allow => panic!("expected a denial"),
    }
}

/// docs/SPEC.md §3, structure: made, removed, renamed or replaced only by smithfs; the operator may remove
/// or rename a smith dir while no run in the subtree is live (else EBUSY); everyone else EPERM.
#[test]
fn structure_bullet() {
    use Area as A;
    use Depth::Top;
    let c = rw();
    let op = Identity::Operator;
    let rename_src = |live| Op::Delete {
        how: Removal::RenameSource,
        subtree_live: live,
    };
    let replaced = Op::Delete {
        how: Removal::Replaced,
        subtree_live: false,
    };
    let rmdir_idle = Op::Delete {
        how: Removal::Rmdir,
        subtree_live: false,
    };
    let dir = x(A::SmithDir, Top);
    assert!(decide(&op, rmdir_idle, &dir, &c).is_allowed());
    assert!(decide(&op, rename_src(false), &dir, &c).is_allowed());
    let d = deny(decide(&op, rename_src(true), &dir, &c));
    assert_eq!((d.errno, d.rule), (Errno::EBUSY, "structure-live-run"));
    assert!(
        d.alternative
            .contains("smithfs cancel smith-root/smith-001/smith-002"),
        "{}",
        d.alternative
    );
    assert_eq!(deny(decide(&op, replaced, &dir, &c)).errno, Errno::EPERM);
    // rm -rf of an idle smith dir works bottom-up: its areas and smith.md may go too, not be renamed.
    for area in [
        A::SmithMd,
        A::Claude,
        A::Inbox,
        A::Private,
        A::Outbox,
        A::Conversations,
        A::Children,
    ] {
        assert!(
            decide(&op, IDLE_UNLINK, &x(area, Top), &c).is_allowed(),
            "{area:?}"
        );
        assert_eq!(
            deny(decide(&op, rename_src(false), &x(area, Top), &c)).errno,
            Errno::EPERM
        );
        assert_eq!(
            deny(decide(&op, Op::Create(NewKind::Dir), &x(area, Top), &c)).errno,
            Errno::EPERM
        );
    }
    assert!(decide(&op, IDLE_UNLINK, &x(A::Conversations, Depth::Inner), &c).is_allowed());
    let d = deny(decide(
        &op,
        rename_src(false),
        &x(A::Conversations, Depth::Inner),
        &c,
    ));
    assert_eq!(d.errno, Errno::EACCES);
    // Smiths never touch structure, whatever their relation, idle or not.
    for s in [X, P, CHILD, ROOT] {
        for zone in [
            dir,
            x(A::Private, Top),
            x(A::SmithMd, Top),
            x(A::Children, Top),
        ] {
            for del in [
                IDLE_UNLINK,
                rename_src(false),
                replaced,
                Op::Create(NewKind::RenameDest),
            ] {
                let d = deny(decide(&Identity::Smith(s), del, &zone, &c));
                assert_eq!(
                    (d.errno, d.rule),
                    (Errno::EPERM, "structure-smithfs-only"),
                    "{s:?} {del:?} {zone:?}"
                );
            }
        }
    }
    // A smith's own config.json and top-level files are not structure.
    assert!(decide(&Identity::Smith(P), IDLE_UNLINK, &x(A::Config, Top), &c).is_allowed());
    assert!(decide(&Identity::Smith(X), IDLE_UNLINK, &x(A::Other, Top), &c).is_allowed());
}

/// docs/SPEC.md §3, special files: devices EPERM for all but the operator; FIFOs and sockets like files
/// (the table test checks them cell by cell).
#[test]
fn special_files_bullet() {
    let c = rw();
    let dev = Op::Create(NewKind::Device);
    let private = x(Area::Private, Depth::Inner);
    for s in [X, P, ROOT] {
        let d = deny(decide(&Identity::Smith(s), dev, &private, &c));
        assert_eq!((d.errno, d.rule), (Errno::EPERM, "device-operator-only"));
    }
    assert!(decide(&Identity::Operator, dev, &private, &c).is_allowed());
    assert_eq!(
        deny(decide(
            &Identity::Operator,
            dev,
            &x(Area::Conversations, Depth::Inner),
            &c
        ))
        .errno,
        Errno::EACCES
    );
    assert_eq!(
        deny(decide(&Identity::Unknown, dev, &private, &c)).errno,
        Errno::EACCES
    );
    assert_eq!(
        deny(decide(
            &Identity::Operator,
            dev,
            &private,
            &ctx(OperatorMode::ReadOnly)
        ))
        .errno,
        Errno::EACCES
    );
}

/// docs/SPEC.md §3, rename = delete at the source ∧ create at the destination (∧ delete on the replaced).
#[test]
fn rename_bullet() {
    use Area as A;
    use Depth::Inner;
    let c = rw();
    let sx = Identity::Smith(X);
    let sp = Identity::Smith(P);
    // A smith publishes atomically from private/ to outbox/, replacing an old result.
    let outbox = x(A::Outbox, Inner);
    assert!(decide_rename(
        &sx,
        &x(A::Private, Inner),
        false,
        &outbox,
        Some((&outbox, false)),
        &c
    )
    .is_allowed());
    // A parent moves a task from its private/ into a child's inbox/.
    assert!(decide_rename(
        &sp,
        &zone_of(P, A::Private, Inner),
        false,
        &x(A::Inbox, Inner),
        None,
        &c
    )
    .is_allowed());
    // ... but not out of the child's outbox (no delete there), nor into its private/.
    let d = deny(decide_rename(
        &sp,
        &outbox,
        false,
        &zone_of(P, A::Private, Inner),
        None,
        &c,
    ));
    assert_eq!((d.errno, d.rule), (Errno::EACCES, "outbox-owner-writes"));
    let d = deny(decide_rename(
        &sp,
        &zone_of(P, A::Private, Inner),
        false,
        &x(A::Private, Inner),
        None,
        &c,
    ));
    assert_eq!((d.errno, d.rule), (Errno::EACCES, "private-owner-only"));
    // A smith cannot drop a task into its own inbox/.
    assert!(!decide_rename(
        &sx,
        &x(A::Private, Inner),
        false,
        &x(A::Inbox, Inner),
        None,
        &c
    )
    .is_allowed());
    // Replacing something the caller may not delete is refused.
    let d = deny(decide_rename(
        &sx,
        &x(A::Private, Inner),
        false,
        &x(A::Other, Inner),
        Some((&x(A::Inbox, Inner), false)),
        &c,
    ));
    assert_eq!(d.rule, "inbox-parent-writes");
    // The operator renames an idle smith dir away, e.g. into results/.
    let dir = x(A::SmithDir, Depth::Top);
    let archive = out(RootArea::Results, Inner);
    assert!(decide_rename(&Identity::Operator, &dir, false, &archive, None, &c).is_allowed());
    assert_eq!(
        deny(decide_rename(
            &Identity::Operator,
            &dir,
            true,
            &archive,
            None,
            &c
        ))
        .errno,
        Errno::EBUSY
    );
    // Nothing is renamed into children/: only the scaffold makes entries there.
    let d = deny(decide_rename(
        &Identity::Operator,
        &archive,
        false,
        &x(A::Children, Inner),
        None,
        &c,
    ));
    assert_eq!((d.errno, d.rule), (Errno::EPERM, "children-scaffold-only"));
}

/// docs/SPEC.md §3, link only within one zone, else EXDEV.
#[test]
fn link_bullet() {
    use Area as A;
    use Depth::{Inner, Top};
    let c = rw();
    let sx = Identity::Smith(X);
    assert!(decide_link(&sx, &x(A::Private, Inner), &x(A::Private, Inner), &c).is_allowed());
    assert!(decide_link(&sx, &x(A::Other, Top), &x(A::Other, Inner), &c).is_allowed());
    let d = deny(decide_link(
        &sx,
        &x(A::Private, Inner),
        &x(A::Outbox, Inner),
        &c,
    ));
    assert_eq!((d.errno, d.rule), (Errno::EXDEV, "link-one-zone"));
    assert!(
        d.why.contains("private/") && d.why.contains("outbox/"),
        "{}",
        d.why
    );
    let d = deny(decide_link(
        &Identity::Smith(P),
        &zone_of(P, A::Private, Inner),
        &x(A::Inbox, Inner),
        &c,
    ));
    assert_eq!(d.errno, Errno::EXDEV);
    // Same zone, but no create right there.
    let d = deny(decide_link(
        &sx,
        &x(A::Inbox, Inner),
        &x(A::Inbox, Inner),
        &c,
    ));
    assert_eq!(d.errno, Errno::EACCES);
    assert_eq!(
        deny(decide_link(
            &Identity::Unknown,
            &x(A::Private, Inner),
            &x(A::Outbox, Inner),
            &c
        ))
        .errno,
        Errno::EACCES
    );
    assert!(decide_link(
        &Identity::Operator,
        &out(RootArea::Results, Inner),
        &out(RootArea::Results, Inner),
        &c
    )
    .is_allowed());
}

/// docs/SPEC.md §3, an inode with names in several zones gets the intersection of their rights.
#[test]
fn multi_zone_intersection() {
    let c = rw();
    let zones = [
        x(Area::Private, Depth::Inner),
        x(Area::Outbox, Depth::Inner),
    ];
    assert!(decide_all(&Identity::Smith(X), Op::Write, &zones, &c).is_allowed());
    let d = deny(decide_all(&Identity::Smith(P), Op::Read, &zones, &c));
    assert_eq!(d.rule, "private-owner-only");
    assert!(decide(&Identity::Smith(P), Op::Read, &zones[1], &c).is_allowed());
    // No zone restricts an inode with no other names: what the filesystem has always decided.
    assert!(decide_all(&Identity::Operator, Op::Read, &[], &c).is_allowed());
    assert!(decide_all(&Identity::Smith(P), Op::Write, &[], &c).is_allowed());
}

/// A rename of one name of a file that has other names stays within one zone (else EXDEV, like a
/// cross-zone link); within one zone, depth ignored, it is allowed.
#[test]
fn linked_rename_stays_in_one_zone() {
    use Area as A;
    use Depth::{Inner, Top};
    let c = rw();
    let sx = Identity::Smith(X);
    assert!(
        decide_linked_rename(&sx, &x(A::Private, Inner), &x(A::Private, Inner), &c).is_allowed()
    );
    assert!(decide_linked_rename(&sx, &x(A::Other, Top), &x(A::Other, Inner), &c).is_allowed());
    let d = deny(decide_linked_rename(
        &sx,
        &x(A::Private, Inner),
        &x(A::Outbox, Inner),
        &c,
    ));
    assert_eq!((d.errno, d.rule), (Errno::EXDEV, "linked-rename-one-zone"));
    assert!(
        d.why.contains("private/") && d.why.contains("outbox/") && d.why.ends_with('.'),
        "{}",
        d.why
    );
    let d = deny(decide_linked_rename(
        &Identity::Operator,
        &zone_of(P, A::Private, Inner),
        &x(A::Inbox, Inner),
        &c,
    ));
    assert_eq!(d.errno, Errno::EXDEV);
}

/// A file with names smithfs has not seen is the owner's (of the name used) and the operator's
/// alone; lookups stay free.
#[test]
fn unseen_names_fail_closed() {
    use Area as A;
    use Depth::Inner;
    let c = rw();
    let outbox = x(A::Outbox, Inner);
    for op in [Op::Read, Op::Write] {
        assert!(decide_unseen_names(&Identity::Smith(X), op, &outbox, &c).is_allowed());
        assert!(decide_unseen_names(&Identity::Operator, op, &outbox, &c).is_allowed());
        let d = deny(decide_unseen_names(&Identity::Smith(P), op, &outbox, &c));
        assert_eq!((d.errno, d.rule), (Errno::EACCES, "links-unseen"));
        assert!(d.why.contains("smith-002"), "{}", d.why);
    }
    assert!(decide_unseen_names(&Identity::Smith(P), Op::Getattr, &outbox, &c).is_allowed());
    assert_eq!(
        deny(decide_unseen_names(
            &Identity::Unknown,
            Op::Read,
            &outbox,
            &c
        ))
        .rule,
        "unknown-lookup-only"
    );
    // Outside the smith dirs nobody owns the name: only the operator keeps its rights.
    let agents = out(RootArea::Agents, Inner);
    assert!(!decide_unseen_names(&Identity::Smith(ROOT), Op::Read, &agents, &c).is_allowed());
    assert!(decide_unseen_names(&Identity::Operator, Op::Read, &agents, &c).is_allowed());
    // project.git's objects are hardlinked with the user's repository (`clone --local`, §11):
    // every smith reads them; writing stays the operator's.
    let objects = out(RootArea::Project, Inner);
    assert!(decide_unseen_names(&Identity::Smith(X), Op::Read, &objects, &c).is_allowed());
    assert!(!decide_unseen_names(&Identity::Smith(X), Op::Write, &objects, &c).is_allowed());
}

/// docs/SPEC.md §3, children/: a mkdir in it is the scaffold's (routed by `is_children_dir`), and
/// `decide` never allows a plain create there.
#[test]
fn children_dir_is_for_the_scaffold() {
    let c = rw();
    let children = x(Area::Children, Depth::Top);
    assert!(children.is_children_dir());
    let slot = children.child_zone(OsStr::new("smith-001"));
    for id in [Identity::Smith(X), Identity::Operator] {
        for kind in [
            NewKind::Dir,
            NewKind::File,
            NewKind::Symlink,
            NewKind::RenameDest,
        ] {
            let d = deny(decide(&id, Op::Create(kind), &slot, &c));
            assert_eq!((d.errno, d.rule), (Errno::EPERM, "children-scaffold-only"));
        }
    }
    let d = deny(decide(
        &Identity::Smith(P),
        Op::Create(NewKind::Dir),
        &slot,
        &c,
    ));
    assert_eq!(d.errno, Errno::EACCES);
}

/// The sentences: who may not do what where, who may, and what to do instead.
#[test]
fn denial_sentences() {
    let c = rw();
    let cousin_private = zone_of(COUSIN, Area::Private, Depth::Inner);
    let d = deny(decide(&Identity::Smith(P), Op::Write, &cousin_private, &c));
    assert_eq!(d.rule, "private-owner-only");
    assert_eq!(
        d.why,
        "smith-root/smith-001 may not write in smith-root/smith-002's private/: only smith-002 and the operator may."
    );
    assert_eq!(
        d.alternative,
        "work in your own private/ (smiths/smith-root/children/smith-001/private/) and publish in your outbox/ (smiths/smith-root/children/smith-001/outbox/)"
    );
    let d = deny(decide(
        &Identity::Smith(X),
        Op::Create(NewKind::File),
        &x(Area::Inbox, Depth::Inner),
        &c,
    ));
    assert_eq!(
        d.why,
        "smith-root/smith-001/smith-002 may not create in smith-root/smith-001/smith-002's inbox/: only its parent smith-001 and the operator may."
    );
    assert!(
        d.alternative.starts_with("your parent writes your inbox/"),
        "{}",
        d.alternative
    );
    let d = deny(decide(
        &Identity::Smith(P),
        Op::Read,
        &x(Area::Private, Depth::Top),
        &c,
    ));
    assert!(
        d.why
            .contains("may not read smith-root/smith-001/smith-002's private/"),
        "{}",
        d.why
    );
    assert!(
        d.alternative
            .contains("smiths/smith-root/children/smith-001/children/smith-002/inbox/"),
        "{}",
        d.alternative
    );
    let d = deny(decide(
        &Identity::Operator,
        Op::Write,
        &x(Area::Conversations, Depth::Inner),
        &c,
    ));
    assert!(
        d.why.ends_with("nobody may, smithfs alone does."),
        "{}",
        d.why
    );
    let d = deny(decide(
        &Identity::Unknown,
        Op::Read,
        &x(Area::Outbox, Depth::Inner),
        &c,
    ));
    assert_eq!((d.errno, d.rule), (Errno::EACCES, "unknown-lookup-only"));
    assert!(
        d.why.starts_with("an unidentified process may not read in"),
        "{}",
        d.why
    );
    // Without names the sentence still reads.
    let anon = Ctx {
        names: &NoNames,
        ..rw()
    };
    let d = deny(decide(
        &Identity::Smith(P),
        Op::Write,
        &cousin_private,
        &anon,
    ));
    assert!(
        d.why
            .starts_with("smith #1 may not write in smith #5's private/"),
        "{}",
        d.why
    );
    assert!(d.to_string().contains(" Instead: "));
}

fn family(parent: SmithIdx, level: u8, highest: Option<u32>, n: usize) -> Family {
    Family {
        parent,
        parent_level: level,
        highest_used: highest,
        n_children: n,
        subtree_depth: 0,
    }
}

fn child(caller: Identity, f: Family, name: &str, c: &Ctx<'_>) -> Result<u32, Denial> {
    check_new_child(&caller, &f, OsStr::new(name), c)
}

/// docs/SPEC.md §4, one test per step, and the order between steps.
#[test]
fn section_4_step_1_caller() {
    let c = rw();
    let f = family(X, 2, Some(1), 1);
    assert_eq!(child(Identity::Smith(X), f, "smith-002", &c), Ok(2));
    assert_eq!(child(Identity::Operator, f, "smith-002", &c), Ok(2));
    for other in [P, ROOT, CHILD, SIBLING] {
        let d = child(Identity::Smith(other), f, "smith-002", &c).unwrap_err();
        assert_eq!((d.errno, d.rule), (Errno::EACCES, "scaffold-parent-only"));
    }
    assert_eq!(
        child(Identity::Unknown, f, "smith-002", &c)
            .unwrap_err()
            .errno,
        Errno::EACCES
    );
    let d = child(
        Identity::Operator,
        f,
        "smith-002",
        &ctx(OperatorMode::ReadOnly),
    )
    .unwrap_err();
    assert_eq!((d.errno, d.rule), (Errno::EACCES, "operator-read-only"));
    // Step 1 comes before step 2: an outsider at the depth limit gets EACCES.
    let deep = family(CHILD, 3, None, 0);
    assert_eq!(
        child(Identity::Smith(X), deep, "bad", &c)
            .unwrap_err()
            .errno,
        Errno::EACCES
    );
}

#[test]
fn section_4_step_2_depth() {
    let c = rw();
    assert_eq!(
        child(Identity::Smith(X), family(X, 2, None, 0), "smith-001", &c),
        Ok(1)
    );
    let d = child(
        Identity::Smith(CHILD),
        family(CHILD, 3, None, 0),
        "smith-001",
        &c,
    )
    .unwrap_err();
    assert_eq!((d.errno, d.rule), (Errno::EPERM, "scaffold-max-level"));
    assert!(
        d.why.contains("level 3") && d.why.contains("limits.max_level is 3"),
        "{}",
        d.why
    );
    let flat = Ctx {
        limits: Limits {
            max_level: 0,
            max_children: 5,
            ..Limits::default()
        },
        ..rw()
    };
    assert_eq!(
        child(
            Identity::Operator,
            family(ROOT, 0, None, 0),
            "smith-001",
            &flat
        )
        .unwrap_err()
        .errno,
        Errno::EPERM
    );
    let top = Ctx {
        limits: Limits {
            max_level: u8::MAX,
            max_children: 5,
            ..Limits::default()
        },
        ..rw()
    };
    assert_eq!(
        child(
            Identity::Operator,
            family(ROOT, u8::MAX, None, 0),
            "smith-001",
            &top
        )
        .unwrap_err()
        .errno,
        Errno::EPERM
    );
    // Step 2 comes before step 3.
    let d = child(
        Identity::Smith(CHILD),
        family(CHILD, 3, None, 0),
        "nope",
        &c,
    )
    .unwrap_err();
    assert_eq!(d.errno, Errno::EPERM);
}

#[test]
fn section_4_step_3_name() {
    let c = rw();
    let f = family(X, 2, Some(4), 2);
    let sx = Identity::Smith(X);
    for bad in [
        "smith-01",
        "smith-",
        "smith-abc",
        "Smith-005",
        "smith-005x",
        "child",
        "smith-+05",
        "smith-99999999999",
    ] {
        let d = child(sx, f, bad, &c).unwrap_err();
        assert_eq!(
            (d.errno, d.rule),
            (Errno::EINVAL, "scaffold-child-name"),
            "{bad}"
        );
        assert!(d.why.ends_with("use smith-005."), "{bad}: {}", d.why);
        assert_eq!(
            d.alternative,
            "mkdir smiths/smith-root/children/smith-001/children/smith-002/children/smith-005"
        );
    }
    // A number beyond every child id (u64 overflow too): `why` says the number is too large.
    for huge in [
        "smith-4294967296",
        "smith-18446744073709551616",
        "smith-99999999999999999999999",
    ] {
        let d = child(sx, f, huge, &c).unwrap_err();
        assert_eq!(d.errno, Errno::EINVAL, "{huge}");
        assert!(
            d.why.contains(
                "has a number too large for a child id (the largest is smith-4294967295)"
            ),
            "{huge}: {}",
            d.why
        );
    }
    for used in ["smith-001", "smith-004", "smith-0004"] {
        let d = child(sx, f, used, &c).unwrap_err();
        assert_eq!(d.errno, Errno::EINVAL, "{used}");
        assert!(
            d.why.contains("up to smith-004") && d.why.ends_with("use smith-005."),
            "{}",
            d.why
        );
    }
    assert_eq!(child(sx, f, "smith-005", &c), Ok(5));
    assert_eq!(child(sx, f, "smith-010", &c), Ok(10)); // gaps allowed
    assert_eq!(child(sx, f, "smith-0007", &c), Ok(7)); // three or more digits
    assert_eq!(child(sx, family(X, 2, None, 0), "smith-000", &c), Ok(0));
    let d = child(sx, family(X, 2, None, 0), "x", &c).unwrap_err();
    assert!(d.why.ends_with("use smith-001."), "{}", d.why);
    let d = check_new_child(&sx, &f, OsStr::from_bytes(b"smith-\xff05"), &c).unwrap_err();
    assert_eq!(d.errno, Errno::EINVAL);
    let d = child(sx, family(X, 2, Some(u32::MAX), 0), "smith-001", &c).unwrap_err();
    assert!(d.why.ends_with("no id is left."), "{}", d.why);
    // Step 3 comes before step 4.
    assert_eq!(
        child(sx, family(X, 2, Some(4), 5), "smith-004", &c)
            .unwrap_err()
            .errno,
        Errno::EINVAL
    );
}

#[test]
fn section_4_step_4_count() {
    let c = rw();
    let sx = Identity::Smith(X);
    assert_eq!(child(sx, family(X, 2, Some(4), 4), "smith-005", &c), Ok(5));
    let d = child(sx, family(X, 2, Some(5), 5), "smith-006", &c).unwrap_err();
    assert_eq!((d.errno, d.rule), (Errno::EDQUOT, "scaffold-max-children"));
    assert!(d.why.contains("already has 5 children"), "{}", d.why);
    let none = Ctx {
        limits: Limits {
            max_level: 3,
            max_children: 0,
            ..Limits::default()
        },
        ..rw()
    };
    assert_eq!(
        child(sx, family(X, 2, None, 0), "smith-001", &none)
            .unwrap_err()
            .errno,
        Errno::EDQUOT
    );
}

/// A smith dir moved into a `children/` brings its subtree: its deepest smith must stay within
/// max_level (docs/PROTOCOL-NOTES.md, C35).
#[test]
fn section_4_step_2_depth_of_a_moved_subtree() {
    let c = rw();
    let op = Identity::Operator;
    let deep = |level, depth| Family {
        subtree_depth: depth,
        ..family(P, level, None, 0)
    };
    assert_eq!(child(op, deep(1, 1), "smith-001", &c), Ok(1));
    let d = child(op, deep(1, 2), "smith-001", &c).unwrap_err();
    assert_eq!((d.errno, d.rule), (Errno::EPERM, "scaffold-max-level"));
    assert!(
        d.why
            .contains("with 2 levels of smiths below it would reach level 4"),
        "{}",
        d.why
    );
    assert_eq!(child(op, deep(0, 2), "smith-001", &c), Ok(1));
    assert_eq!(
        child(op, deep(u8::MAX, u8::MAX), "smith-001", &c)
            .unwrap_err()
            .errno,
        Errno::EPERM
    );
}

/// docs/SPEC.md §3 structure bullet, the rename of a smith dir (docs/PROTOCOL-NOTES.md, C35):
/// the operator alone, never the root, while nothing in the subtree is live; into a `children/`
/// as a mkdir there, elsewhere with the create right; no exchange, no replaced smith dir.
#[test]
fn smith_dir_move() {
    use Depth::{Inner, Top};
    let c = rw();
    let op = Identity::Operator;
    let src = zone_of(X, Area::SmithDir, Top);
    let private = zone_of(P, Area::Private, Inner);
    let fam = family(COUSIN, 1, Some(3), 1);
    let mv = |to, name, live, replaced, exchange| SmithDirMove {
        src: &src,
        src_live: live,
        to,
        name: OsStr::new(name),
        replaced,
        exchange,
    };
    let judge = |id: Identity, m: SmithDirMove<'_>, c: &Ctx<'_>| decide_smith_dir_move(&id, &m, c);
    let err = |r: Result<Option<u32>, Denial>| {
        let d = r.unwrap_err();
        (d.errno, d.rule)
    };
    // Out of the tree: ordinary data wherever the operator may create.
    assert_eq!(
        judge(op, mv(MoveTo::Data(&private), "x", false, None, false), &c),
        Ok(None)
    );
    let results = out(RootArea::Results, Inner);
    assert_eq!(
        judge(op, mv(MoveTo::Data(&results), "x", false, None, false), &c),
        Ok(None)
    );
    let mount_root = out(RootArea::Other, Top);
    assert_eq!(
        judge(
            op,
            mv(MoveTo::Data(&mount_root), "x", false, None, false),
            &c
        ),
        Ok(None)
    );
    let refused = [
        (out(RootArea::Smiths, Inner), "smiths-scaffold-only"),
        (x(Area::Children, Inner), "children-scaffold-only"),
        (
            zone_of(P, Area::Conversations, Inner),
            "conversations-smithfs-writes",
        ),
    ];
    for (zone, rule) in &refused {
        let got = err(judge(
            op,
            mv(MoveTo::Data(zone), "x", false, None, false),
            &c,
        ));
        assert_eq!(got.1, *rule, "{zone:?}");
    }
    // Into a children/: the §4 checks, in §4's order.
    assert_eq!(
        judge(
            op,
            mv(MoveTo::Children(&fam), "smith-004", false, None, false),
            &c
        ),
        Ok(Some(4))
    );
    assert_eq!(
        judge(
            op,
            mv(MoveTo::Children(&fam), "smith-020", false, None, false),
            &c
        ),
        Ok(Some(20))
    );
    for bad in ["smith-003", "smith-001", "x", "smith-02", "smith-abc"] {
        assert_eq!(
            err(judge(
                op,
                mv(MoveTo::Children(&fam), bad, false, None, false),
                &c
            )),
            (Errno::EINVAL, "scaffold-child-name"),
            "{bad}"
        );
    }
    let deep = Family {
        subtree_depth: 2,
        ..fam
    };
    assert_eq!(
        err(judge(
            op,
            mv(MoveTo::Children(&deep), "bad", false, None, false),
            &c
        )),
        (Errno::EPERM, "scaffold-max-level")
    );
    let full = family(COUSIN, 1, Some(5), 5);
    assert_eq!(
        err(judge(
            op,
            mv(MoveTo::Children(&full), "smith-006", false, None, false),
            &c
        )),
        (Errno::EDQUOT, "scaffold-max-children")
    );
    // A live run in the subtree: EBUSY, wherever it goes.
    for to in [MoveTo::Data(&private), MoveTo::Children(&fam)] {
        let d = judge(op, mv(to, "smith-004", true, None, false), &c).unwrap_err();
        assert_eq!((d.errno, d.rule), (Errno::EBUSY, "structure-live-run"));
        assert!(
            d.alternative
                .contains("smithfs cancel smith-root/smith-001/smith-002"),
            "{}",
            d.alternative
        );
    }
    // Everyone else: EPERM for smiths (the owner, its parent, the root, a child), EACCES for
    // Unknown and the read-only operator.
    for s in [X, P, ROOT, CHILD, SIBLING] {
        for to in [MoveTo::Data(&private), MoveTo::Children(&fam)] {
            assert_eq!(
                err(judge(
                    Identity::Smith(s),
                    mv(to, "smith-004", false, None, false),
                    &c
                )),
                (Errno::EPERM, "structure-smithfs-only"),
                "{s:?}"
            );
        }
    }
    assert_eq!(
        err(judge(
            Identity::Unknown,
            mv(MoveTo::Data(&private), "x", false, None, false),
            &c
        ))
        .0,
        Errno::EACCES
    );
    assert_eq!(
        err(judge(
            op,
            mv(MoveTo::Data(&private), "x", false, None, false),
            &ctx(OperatorMode::ReadOnly)
        )),
        (Errno::EACCES, "operator-read-only")
    );
    // Never the root smith dir, never an exchange, never over another smith dir.
    let root_dir = zone_of(ROOT, Area::SmithDir, Top);
    let m = SmithDirMove {
        src: &root_dir,
        ..mv(MoveTo::Data(&private), "x", false, None, false)
    };
    assert_eq!(
        err(judge(op, m, &c)),
        (Errno::EPERM, "structure-root-smith")
    );
    assert_eq!(err(judge(Identity::Smith(ROOT), m, &c)).0, Errno::EPERM);
    let other_dir = zone_of(COUSIN, Area::SmithDir, Top);
    assert_eq!(
        err(judge(
            op,
            mv(
                MoveTo::Data(&private),
                "x",
                false,
                Some((&private, false)),
                true
            ),
            &c
        )),
        (Errno::EPERM, "structure-exchange")
    );
    assert_eq!(
        err(judge(
            op,
            mv(
                MoveTo::Children(&fam),
                "smith-004",
                false,
                Some((&other_dir, false)),
                false
            ),
            &c
        )),
        (Errno::EPERM, "structure-smithfs-only")
    );
    // Over an empty plain directory where the operator may delete: allowed, as any rename.
    assert_eq!(
        judge(
            op,
            mv(
                MoveTo::Data(&private),
                "x",
                false,
                Some((&private, false)),
                false
            ),
            &c
        ),
        Ok(None)
    );
}

#[test]
fn smith_000_counts_as_a_used_number() {
    let c = rw();
    let sx = Identity::Smith(X);
    assert_eq!(child(sx, family(X, 0, None, 0), "smith-000", &c), Ok(0));
    let d = child(sx, family(X, 0, Some(0), 1), "smith-000", &c).unwrap_err();
    assert!(d.why.ends_with("use smith-001."), "{}", d.why);
}

// ---- property tests ----

fn arb_idx() -> impl Strategy<Value = SmithIdx> {
    (0u32..6).prop_map(SmithIdx)
}

fn arb_identity() -> impl Strategy<Value = Identity> {
    prop_oneof![
        4 => arb_idx().prop_map(Identity::Smith),
        1 => Just(Identity::Operator),
        1 => Just(Identity::Unknown),
    ]
}

fn arb_depth() -> impl Strategy<Value = Depth> {
    prop_oneof![Just(Depth::Top), Just(Depth::Inner)]
}

fn arb_zone() -> impl Strategy<Value = Zone> {
    let smith = (
        arb_idx(),
        proptest::option::of(arb_idx()),
        0u8..5,
        proptest::sample::select(Area::ALL.to_vec()),
        arb_depth(),
    )
        .prop_filter("a smith is not its own parent", |(o, p, ..)| Some(*o) != *p)
        .prop_map(|(owner, owner_parent, owner_level, area, depth)| {
            let depth = if area == Area::SmithDir {
                Depth::Top
            } else {
                depth
            };
            Zone::Smith(SmithZone {
                owner,
                owner_parent,
                owner_level,
                area,
                depth,
            })
        });
    let outside = (
        proptest::sample::select(vec![
            RootArea::MountRoot,
            RootArea::Config,
            RootArea::Templates,
            RootArea::Agents,
            RootArea::Results,
            RootArea::Smiths,
            RootArea::Other,
            RootArea::Control,
            RootArea::ControlCtl,
            RootArea::Reserved,
        ]),
        arb_depth(),
    )
        .prop_map(|(area, depth)| Zone::Outside { area, depth });
    prop_oneof![3 => smith, 1 => outside]
}

fn arb_op() -> impl Strategy<Value = Op> {
    let kind = proptest::sample::select(vec![
        NewKind::File,
        NewKind::Dir,
        NewKind::Symlink,
        NewKind::Fifo,
        NewKind::Socket,
        NewKind::Device,
        NewKind::Link,
        NewKind::RenameDest,
    ]);
    let how = proptest::sample::select(vec![
        Removal::Unlink,
        Removal::Rmdir,
        Removal::RenameSource,
        Removal::Replaced,
    ]);
    prop_oneof![
        Just(Op::Lookup),
        Just(Op::Getattr),
        Just(Op::Statfs),
        Just(Op::Read),
        Just(Op::Write),
        kind.prop_map(Op::Create),
        (how, any::<bool>()).prop_map(|(how, subtree_live)| Op::Delete { how, subtree_live }),
    ]
}

fn arb_ctx() -> impl Strategy<Value = Ctx<'static>> {
    (any::<bool>(), proptest::option::of(arb_idx())).prop_map(|(ro, root)| Ctx {
        operator: if ro {
            OperatorMode::ReadOnly
        } else {
            OperatorMode::ReadWrite
        },
        root,
        limits: Limits::default(),
        project: true,
        names: &names,
    })
}

fn lookup_class(op: Op) -> bool {
    matches!(
        op.class(),
        OpClass::Lookup | OpClass::Getattr | OpClass::Statfs
    )
}

proptest! {
    /// No smith other than the owner (and the operator) ever reads, writes, creates or deletes in a
    /// smith's private/.
    #[test]
    fn private_is_the_owners(id in arb_idx(), zone in arb_zone(), op in arb_op(), c in arb_ctx()) {
        if let Zone::Smith(z) = zone {
            if z.area == Area::Private && id != z.owner && !lookup_class(op) {
                prop_assert!(!decide(&Identity::Smith(id), op, &zone, &c).is_allowed());
            }
        }
    }

    /// A smith that is neither X nor P(X) — X's children included — may only list X's smith dir and
    /// children/: a child's rights never include its parent's areas.
    #[test]
    fn others_only_see_the_tree(id in arb_idx(), zone in arb_zone(), op in arb_op(), c in arb_ctx()) {
        if let Zone::Smith(z) = zone {
            if id != z.owner && Some(id) != z.owner_parent
                && decide(&Identity::Smith(id), op, &zone, &c).is_allowed() {
                prop_assert!(lookup_class(op)
                    || (op == Op::Read && matches!(z.area, Area::SmithDir | Area::Children)));
            }
        }
    }

    /// Unknown never gets anything but lookup, getattr and statfs.
    #[test]
    fn unknown_only_looks(zone in arb_zone(), dst in arb_zone(), op in arb_op(), c in arb_ctx()) {
        let allowed = decide(&Identity::Unknown, op, &zone, &c).is_allowed();
        prop_assert_eq!(allowed, lookup_class(op));
        prop_assert!(!decide_link(&Identity::Unknown, &zone, &dst, &c).is_allowed());
        prop_assert!(!decide_rename(&Identity::Unknown, &zone, false, &dst, None, &c).is_allowed());
    }

    /// Lookup, getattr and statfs are allowed to every identity everywhere.
    #[test]
    fn lookups_are_free(id in arb_identity(), zone in arb_zone(), c in arb_ctx()) {
        for op in [Op::Lookup, Op::Getattr, Op::Statfs] {
            prop_assert!(decide(&id, op, &zone, &c).is_allowed());
        }
    }

    /// rename allowed ⇒ delete at the source, create at the destination (and delete on the replaced
    /// entry) each allowed.
    #[test]
    fn rename_needs_delete_and_create(
        id in arb_identity(), src in arb_zone(), dst in arb_zone(), rep in proptest::option::of(arb_zone()),
        live in any::<bool>(), c in arb_ctx(),
    ) {
        if decide_rename(&id, &src, live, &dst, rep.as_ref().map(|z| (z, live)), &c).is_allowed() {
            let del = |how| Op::Delete { how, subtree_live: live };
            prop_assert!(decide(&id, del(Removal::RenameSource), &src, &c).is_allowed());
            prop_assert!(decide(&id, Op::Create(NewKind::RenameDest), &dst, &c).is_allowed());
            if let Some(r) = rep {
                prop_assert!(decide(&id, del(Removal::Replaced), &r, &c).is_allowed());
            }
        }
    }

    /// link allowed ⇒ one zone and the create right at the destination.
    #[test]
    fn link_stays_in_one_zone(id in arb_identity(), src in arb_zone(), dst in arb_zone(), c in arb_ctx()) {
        if decide_link(&id, &src, &dst, &c).is_allowed() {
            prop_assert!(src.same_zone(&dst));
            prop_assert!(decide(&id, Op::Create(NewKind::Link), &dst, &c).is_allowed());
        }
    }

    /// A linked rename allowed ⇒ one zone; a file with unseen names is never another smith's.
    #[test]
    fn linked_names_stay_in_one_zone(id in arb_identity(), src in arb_zone(), dst in arb_zone(), op in arb_op(), c in arb_ctx()) {
        if decide_linked_rename(&id, &src, &dst, &c).is_allowed() {
            prop_assert!(src.same_zone(&dst));
        }
        if let Identity::Smith(s) = id {
            if !lookup_class(op) && decide_unseen_names(&id, op, &src, &c).is_allowed() {
                prop_assert_eq!(src.owner(), Some(s));
            }
        }
    }

    /// Only the operator creates device nodes.
    #[test]
    fn devices_are_the_operators(id in arb_identity(), zone in arb_zone(), c in arb_ctx()) {
        if decide(&id, Op::Create(NewKind::Device), &zone, &c).is_allowed() {
            prop_assert_eq!(id, Identity::Operator);
        }
    }

    /// A read-only operator changes nothing but the root's inbox/**, config.json and .smithfs/ctl.
    #[test]
    fn read_only_operator_changes_little(zone in arb_zone(), op in arb_op(), c in arb_ctx()) {
        let c = Ctx { operator: OperatorMode::ReadOnly, ..c };
        if !lookup_class(op) && op != Op::Read && decide(&Identity::Operator, op, &zone, &c).is_allowed() {
            let ok = match zone {
                Zone::Smith(z) => z.owner_level == 0 && z.area == Area::Inbox && z.depth == Depth::Inner,
                Zone::Outside { area, .. } => area == RootArea::ControlCtl || (area == RootArea::Config && op == Op::Write),
            };
            prop_assert!(ok, "{:?} {:?}", op, zone);
        }
    }

    /// Structure is never created or replaced through the mount, by anyone.
    #[test]
    fn structure_is_smithfs_made(id in arb_identity(), zone in arb_zone(), kind in arb_op(), c in arb_ctx()) {
        let creates = matches!(kind, Op::Create(_) | Op::Delete { how: Removal::Replaced, .. });
        if zone.is_structure() && creates {
            prop_assert!(!decide(&id, kind, &zone, &c).is_allowed());
        }
    }

    /// decide_all over one zone is decide; over several, it allows only if each allows. Every denial
    /// has an errno of the protocol and two sentences.
    #[test]
    fn intersection_and_denials(id in arb_identity(), a in arb_zone(), b in arb_zone(), op in arb_op(), c in arb_ctx()) {
        prop_assert_eq!(decide_all(&id, op, &[a], &c), decide(&id, op, &a, &c));
        let both = decide_all(&id, op, &[a, b], &c).is_allowed();
        prop_assert_eq!(both, decide(&id, op, &a, &c).is_allowed() && decide(&id, op, &b, &c).is_allowed());
        if let Decision::Deny(d) = decide(&id, op, &a, &c) {
            prop_assert!([Errno::EACCES, Errno::EPERM, Errno::EBUSY].contains(&d.errno));
            prop_assert!(!d.why.is_empty() && !d.alternative.is_empty() && !d.rule.is_empty());
            prop_assert!(d.why.ends_with('.'));
        }
    }
}

/// The names used by whoami and messages stay readable for a registry without names.
#[test]
fn names_from_a_map() {
    let map: HashMap<SmithIdx, String> = [(X, "smith-root/smith-007".to_owned())].into();
    let lookup = |s: SmithIdx| {
        map.get(&s)
            .and_then(|f| crate::tree::model::FullId::parse(f))
    };
    let c = Ctx {
        names: &lookup,
        ..rw()
    };
    let d = deny(decide(
        &Identity::Smith(P),
        Op::Write,
        &x(Area::Private, Depth::Inner),
        &c,
    ));
    assert!(
        d.why
            .starts_with("smith #1 may not write in smith-root/smith-007's private/"),
        "{}",
        d.why
    );
}

/// Every rule id is distinct and comes from `Rule::id()`: no other source file spells one.
#[test]
fn rule_ids_are_unique_and_only_in_rule_id() {
    let ids: Vec<&str> = Rule::all().into_iter().map(Rule::id).collect();
    let mut seen = std::collections::HashSet::new();
    for id in &ids {
        assert!(seen.insert(*id), "rule id {id} is used by two rules");
        assert!(
            id.bytes().all(|b| b.is_ascii_lowercase() || b == b'-'),
            "{id}"
        );
    }
    // Every variant's id is one of `all()`'s (the outside rules share ids by kind).
    for a in [
        RootArea::MountRoot,
        RootArea::Config,
        RootArea::Templates,
        RootArea::Agents,
        RootArea::Results,
        RootArea::Smiths,
        RootArea::Control,
        RootArea::ControlCtl,
        RootArea::Reserved,
        RootArea::Other,
    ] {
        assert!(seen.contains(Rule::Outside(a).id()), "{a:?}");
    }
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut stack = vec![src];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).expect("read src").flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            if p.extension().and_then(|x| x.to_str()) != Some("rs")
                || p.ends_with("policy/rules.rs")
                || p.ends_with("policy/tests.rs")
            {
                continue;
            }
            let text = std::fs::read_to_string(&p).expect("read source");
            for id in &ids {
                assert!(
                    !text.contains(&format!("\"{id}\"")),
                    "{} spells the rule id {id}: use Rule::{:?}.id()",
                    p.display(),
                    Rule::all().into_iter().find(|r| r.id() == *id)
                );
            }
        }
    }
}

/// A refusal as the tables spell it: errno and rule id.
type Refusal = Option<(Errno, &'static str)>;

/// docs/SPEC.md §7: the control files, cell by cell (identity × file × access).
#[test]
fn control_file_opens_cell_by_cell() {
    let smith = Identity::Smith(X);
    #[rustfmt::skip]
    let table: [(&Identity, bool, bool, Refusal); 12] = [
        // (identity, is ctl, writing) → refusal
        (&Identity::Operator, false, false, None),
        (&Identity::Operator, false, true,  Some((Errno::EACCES, "control-read-only"))),
        (&Identity::Operator, true,  false, None),
        (&Identity::Operator, true,  true,  None),
        (&smith,              false, false, None),
        (&smith,              false, true,  Some((Errno::EACCES, "control-read-only"))),
        (&smith,              true,  false, None),
        (&smith,              true,  true,  None),
        (&Identity::Unknown,  false, false, Some((Errno::EACCES, "unknown-control"))),
        (&Identity::Unknown,  false, true,  Some((Errno::EACCES, "unknown-control"))),
        (&Identity::Unknown,  true,  false, Some((Errno::EACCES, "unknown-control"))),
        (&Identity::Unknown,  true,  true,  Some((Errno::EACCES, "unknown-control"))),
    ];
    for (id, is_ctl, writing, want) in table {
        let got = match decide_control_open(id, is_ctl, writing) {
            Decision::Allow => None,
            Decision::Deny(d) => Some((d.errno, d.rule)),
        };
        assert_eq!(got, want, "{id:?} ctl={is_ctl} writing={writing}");
    }
}

/// docs/SPEC.md §6, §7: `ctl` commands by identity, target and ancestry, cell by cell.
#[test]
fn ctl_commands_cell_by_cell() {
    // P is X's parent; ROOT is everyone's ancestor.
    let is_ancestor = |a: SmithIdx, d: SmithIdx| a == ROOT && d != ROOT || (a == P && d == X);
    let (op, p, x, unknown) = (
        Identity::Operator,
        Identity::Smith(P),
        Identity::Smith(X),
        Identity::Unknown,
    );
    #[rustfmt::skip]
    let table: [(&Identity, CtlVerb, Option<SmithIdx>, Refusal); 15] = [
        (&op,      CtlVerb::Bind,   Some(X), None),
        (&p,       CtlVerb::Bind,   Some(X), Some((Errno::EACCES, "ctl-bind-operator-only"))),
        (&x,       CtlVerb::Bind,   Some(X), Some((Errno::EACCES, "ctl-bind-operator-only"))),
        (&unknown, CtlVerb::Bind,   Some(X), Some((Errno::EACCES, "ctl-bind-operator-only"))),
        (&op,      CtlVerb::Bind,   None,    Some((Errno::ENOENT, "ctl-no-such-smith"))),
        (&op,      CtlVerb::Cancel, Some(X), None),
        (&p,       CtlVerb::Cancel, Some(X), None),
        (&x,       CtlVerb::Cancel, Some(X), Some((Errno::EACCES, "ctl-cancel-ancestor-only"))),
        (&x,       CtlVerb::Cancel, Some(P), Some((Errno::EACCES, "ctl-cancel-ancestor-only"))),
        (&unknown, CtlVerb::Cancel, Some(X), Some((Errno::EACCES, "ctl-cancel-ancestor-only"))),
        (&p,       CtlVerb::Cancel, None,    Some((Errno::ENOENT, "ctl-no-such-smith"))),
        (&op,      CtlVerb::Cancel, Some(ROOT), None),
        (&p,       CtlVerb::Retry,  Some(X), None),
        (&x,       CtlVerb::Retry,  Some(P), Some((Errno::EACCES, "ctl-retry-ancestor-only"))),
        (&op,      CtlVerb::Retry,  None,    Some((Errno::ENOENT, "ctl-no-such-smith"))),
    ];
    for (id, verb, target, want) in table {
        let got = match decide_ctl(id, "who", verb, "smith-root/smith-001", target, is_ancestor) {
            Decision::Allow => None,
            Decision::Deny(d) => Some((d.errno, d.rule)),
        };
        assert_eq!(got, want, "{id:?} {verb:?} {target:?}");
    }
    let d = bind_failed(Errno::ESRCH, 42, "smith-root", "no such process 42");
    assert_eq!((d.errno, d.rule), (Errno::ESRCH, "ctl-bind-failed"));
    let d = ctl_syntax("unknown command `x`");
    assert_eq!((d.errno, d.rule), (Errno::EINVAL, "ctl-syntax"));
}

/// docs/SPEC.md §3 special files and §8 budgets: whiteouts, reserved names, open-file limits.
#[test]
fn whiteout_reserved_and_budgets() {
    for (id, want) in [
        (Identity::Operator, None),
        (Identity::Smith(X), Some((Errno::EPERM, "rename-whiteout"))),
        (Identity::Unknown, Some((Errno::EPERM, "rename-whiteout"))),
    ] {
        let got = match decide_rename_whiteout(&id, true) {
            Decision::Allow => None,
            Decision::Deny(d) => Some((d.errno, d.rule)),
        };
        assert_eq!(got, want, "{id:?}");
        assert!(decide_rename_whiteout(&id, false).is_allowed());
    }
    let d = reserved_name();
    assert_eq!((d.errno, d.rule), (Errno::EPERM, "reserved-name"));
    let d = open_budget_denial("smith-root", OpenBudget::PerSmith { limit: 3 });
    assert_eq!((d.errno, d.rule), (Errno::EMFILE, "open-files-per-smith"));
    assert!(d.why.starts_with("smith-root already holds 3 open files"));
    let d = open_budget_denial("operator", OpenBudget::Mount { limit: 9 });
    assert_eq!((d.errno, d.rule), (Errno::ENFILE, "open-files-mount"));
}

/// `CtlAnswer::of` reads back the errnos of the `ctl-*` rules (docs/SPEC.md §6).
#[test]
fn ctl_answers_read_back_the_rule_errnos() {
    use crate::policy::CtlAnswer;
    let of = |e: Errno| CtlAnswer::of(&std::io::Error::from_raw_os_error(e as i32));
    for (rule, want) in [
        (Rule::CtlBindOperatorOnly, CtlAnswer::NotAllowed),
        (Rule::CtlCancelAncestorOnly, CtlAnswer::NotAllowed),
        (Rule::CtlRetryAncestorOnly, CtlAnswer::NotAllowed),
        (Rule::CtlReloadOperatorOnly, CtlAnswer::NotAllowed),
        (Rule::CtlNoSuchSmith, CtlAnswer::NoSuchSmith),
        (Rule::CtlSyntax, CtlAnswer::Refused),
        (Rule::CtlReloadRefused, CtlAnswer::Refused),
        (Rule::CtlBindFailed, CtlAnswer::Other),
    ] {
        assert_eq!(of(rule.errno()), want, "{rule:?}");
    }
    assert_eq!(of(Errno::EPERM), CtlAnswer::NotAllowed);
    assert_eq!(
        CtlAnswer::of(&std::io::Error::other("no errno")),
        CtlAnswer::Other
    );
}

#[test]
fn quota_denials_say_where_the_space_is_held() {
    use crate::policy::{storage_denial, Held, StorageBound};
    let bytes = StorageBound::Bytes {
        limit: 1 << 20,
        used: 1 << 20,
        asked: 4096,
    };
    let mib = 1 << 20;
    // (where it is held, the end of the why, a part of the advice)
    type Row<'a> = (&'a [(Held, u64)], &'a str, &'a str);
    let table: &[Row<'_>] = &[
        (
            &[
                (Held::Own(Area::Private), mib / 10),
                (Held::Own(Area::Conversations), mib * 9 / 10),
                (Held::Own(Area::Outbox), 0),
            ],
            "They are held in conversations/ (your runs' output, which only the operator removes) 0.9 MiB, private/ 0.1 MiB.",
            "ask the operator to remove old runs' directories",
        ),
        (
            &[(Held::ForChildren, mib), (Held::Own(Area::Private), 4096)],
            "They are held in your children's inboxes and configs 1.0 MiB, private/ 0.0 MiB.",
            "remove tasks they have done",
        ),
        (
            &[(Held::Own(Area::Workspace), mib)],
            "They are held in workspace/ 1.0 MiB.",
            "remove or truncate files you no longer need where they are held",
        ),
        (&[], "(limits.max_bytes_per_smith).", "raise limits.max_bytes_per_smith"),
    ];
    for (held, why, alt) in table {
        let d = storage_denial("smith-root/smith-001", bytes, held);
        assert!(d.why.ends_with(why), "{held:?}: {}", d.why);
        assert!(d.alternative.contains(alt), "{held:?}: {}", d.alternative);
        assert_eq!(d.rule, "storage-bytes-per-smith");
    }
    let d = storage_denial(
        "smith-root",
        StorageBound::Inodes {
            limit: 10,
            used: 10,
        },
        &[(Held::Unlinked, 3), (Held::Own(Area::Other), 7)],
    );
    assert!(
        d.why.ends_with("They are held in other files (in your smith dir, or results/) 7, removed files still open 3."),
        "{}",
        d.why
    );
}

#[test]
fn a_failed_workspace_is_one_bounded_line() {
    let long = format!("fatal: {}\nsecond line", "x".repeat(500));
    let d = crate::policy::workspace_failed("smith-root/smith-001", &long);
    assert_eq!(d.rule, Rule::ScaffoldWorkspace.id());
    assert!(d
        .why
        .starts_with("smithfs could not make the workspace of smith-root/smith-001"));
    assert!(
        !d.why.contains('\n') && !d.why.contains("second line"),
        "{}",
        d.why
    );
    assert!(d.why.ends_with(&"x".repeat(293)), "cut to 300 characters");
}
