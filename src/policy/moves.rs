//! The rename of a registered smith dir (docs/SPEC.md §3, the structure bullet: "the operator may
//! remove or rename a smith dir through the mount only while no run in that subtree is live (else
//! EBUSY); everyone else: EPERM"). Pure, like the rest of the policy.
//!
//! A smith dir renamed directly into a smith's `children/` stays a smith dir — the child of that
//! smith under its new name, admitted as a `mkdir` there would be ([`check_new_child`], docs/SPEC.md
//! §4). Renamed anywhere else it stops being a smith dir and becomes ordinary data of the zone it
//! lands in, so the destination needs the caller's create right there, as for any rename. The root
//! smith dir never moves, and neither an exchange nor the replacement of another smith dir is
//! allowed (docs/PROTOCOL-NOTES.md, C35).

use crate::identity::Identity;
use crate::policy::children::{check_new_child, Family};
use crate::policy::rules::{
    decide, full_id, smith_path, Ctx, Decision, Denial, NewKind, Op, Removal, Rule,
};
use crate::policy::zone::Zone;

/// Where a smith dir is renamed to.
#[derive(Clone, Copy, Debug)]
pub enum MoveTo<'a> {
    /// Directly into a smith's `children/`: it stays a smith dir, a child of that smith (the
    /// family describes the smith and the subtree that arrives).
    Children(&'a Family),
    /// Anywhere else: it becomes ordinary data; the zone is the new name's
    /// ([`Zone::child_zone`] of the destination directory).
    Data(&'a Zone),
}

/// A rename whose source is a registered smith dir.
#[derive(Clone, Copy, Debug)]
pub struct SmithDirMove<'a> {
    /// The smith dir's zone (its [`Zone::smith_dir`]).
    pub src: &'a Zone,
    /// A run of the smith or of one of its descendants is live.
    pub src_live: bool,
    /// Where it goes.
    pub to: MoveTo<'a>,
    /// The new name.
    pub name: &'a std::ffi::OsStr,
    /// The entry the rename replaces (or exchanges with), if any, and whether a run is live in its
    /// subtree.
    pub replaced: Option<(&'a Zone, bool)>,
    /// `RENAME_EXCHANGE`.
    pub exchange: bool,
}

/// Decide the rename of a smith dir (docs/SPEC.md §3, §4), in this order:
///
/// 1. the root smith dir, by the operator → EPERM (`structure-root-smith`);
/// 2. the source as [`decide`] judges `Delete { RenameSource }` on a smith dir: Unknown → EACCES,
///    a smith → EPERM (`structure-smithfs-only`), the read-only operator → EACCES, a run live in
///    the subtree → EBUSY (`structure-live-run`);
/// 3. `RENAME_EXCHANGE` → EPERM (`structure-exchange`);
/// 4. the replaced entry as [`decide`] judges `Delete { Replaced }` on it (another smith dir →
///    EPERM);
/// 5. into a `children/`: [`check_new_child`] (depth with the moved subtree → EPERM, name →
///    EINVAL, count → EDQUOT); elsewhere: the create right on the new name (as any rename).
///
/// Returns the child number the smith dir takes in its new `children/`, `None` when it becomes
/// data.
pub fn decide_smith_dir_move(
    id: &Identity,
    m: &SmithDirMove<'_>,
    ctx: &Ctx<'_>,
) -> Result<Option<u32>, Denial> {
    let is_root = match m.src {
        Zone::Smith(z) => z.owner_parent.is_none(),
        Zone::Outside { .. } => false,
    };
    if is_root && matches!(id, Identity::Operator) {
        return Err(structure(
            Rule::StructureRootSmith,
            format!(
                "the operator may not rename {}: the root smith dir stays where smithfs made it.",
                root_path(m.src, ctx)
            ),
            "move the root smith's work (its private/, outbox/ …) instead, or rename a child smith dir",
        ));
    }
    let source = Op::Delete {
        how: Removal::RenameSource,
        subtree_live: m.src_live,
    };
    allowed(decide(id, source, m.src, ctx))?;
    if m.exchange {
        return Err(structure(
            Rule::StructureExchange,
            "the operator may not exchange a smith dir with another entry (RENAME_EXCHANGE): smith dirs are moved, never swapped.".to_owned(),
            "rename the two entries one after the other",
        ));
    }
    if let Some((zone, live)) = m.replaced {
        let op = Op::Delete {
            how: Removal::Replaced,
            subtree_live: live,
        };
        allowed(decide(id, op, zone, ctx))?;
    }
    match m.to {
        MoveTo::Children(family) => check_new_child(id, family, m.name, ctx).map(Some),
        MoveTo::Data(zone) => {
            allowed(decide(id, Op::Create(NewKind::RenameDest), zone, ctx))?;
            Ok(None)
        }
    }
}

fn allowed(d: Decision) -> Result<(), Denial> {
    match d {
        Decision::Allow => Ok(()),
        Decision::Deny(d) => Err(d),
    }
}

fn structure(rule: Rule, why: String, alternative: &str) -> Denial {
    rule.deny(why, alternative.to_owned())
}

/// `smiths/smith-root` (the smith dir of the zone's owner).
fn root_path(zone: &Zone, ctx: &Ctx<'_>) -> String {
    match zone.owner() {
        Some(o) => smith_path(&full_id(o, ctx)),
        None => "the smith dir".to_owned(),
    }
}
