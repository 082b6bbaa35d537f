//! The scaffold's admission check for a new child (docs/SPEC.md §4): who may make one, how deep, under
//! which name, how many. Pure; the caller serialises concurrent mkdirs of one parent and remembers the
//! highest number used across restarts. The same check admits an idle smith dir the operator moves into
//! a `children/` (docs/PROTOCOL-NOTES.md, C35), with the depth of the subtree it brings.

use std::ffi::OsStr;

use crate::config::OperatorMode;
use crate::identity::Identity;
use crate::policy::rules::{full_id, short, smith_path, Ctx, Denial, Rule};
use crate::tree::model::SmithIdx;
use crate::tree::model::{child_name, is_numbered_name, parse_child_name};

/// What the check needs to know of S, the smith a child is made for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Family {
    /// S.
    pub parent: SmithIdx,
    /// S's level (root 0).
    pub parent_level: u8,
    /// The highest child number S has ever used (remembered across restarts), `None` if none.
    pub highest_used: Option<u32>,
    /// S's children now (for a move within S's `children/`, without the one that moves).
    pub n_children: usize,
    /// How many levels of smiths the new child brings below itself: 0 for a mkdir; for a smith dir
    /// moved into S's `children/`, its deepest descendant's level minus its own.
    pub subtree_depth: u8,
}

/// Check `mkdir children/NAME` in S's `children/` (docs/SPEC.md §4), in the protocol's order:
///
/// 1. the caller is neither S nor the operator (or the operator is read-only) → EACCES;
/// 2. `parent_level + 1 + subtree_depth > limits.max_level` → EPERM;
/// 3. NAME is not `smith-NNN`, or its number is not above `highest_used` → EINVAL, naming the next id;
/// 4. `n_children >= limits.max_children` → EDQUOT.
///
/// Returns the child's number. An existing NAME is the kernel's EEXIST, before this is called.
pub fn check_new_child(
    caller: &Identity,
    family: &Family,
    name: &OsStr,
    ctx: &Ctx<'_>,
) -> Result<u32, Denial> {
    let parent = full_id(family.parent, ctx);
    let dir = smith_path(&parent);
    let name_text = name.to_string_lossy();
    let next = match family.highest_used {
        None => Some(1),
        Some(h) => h.checked_add(1),
    };
    let next_name = next.map_or_else(
        || "no id is left".to_owned(),
        |n| format!("use {}", child_name(n)),
    );
    let deny = |rule: Rule, why: String, alternative: String| rule.deny(why, alternative);

    // 1. Who.
    match caller {
        Identity::Smith(s) if *s == family.parent => {}
        Identity::Operator if ctx.operator == OperatorMode::ReadWrite => {}
        Identity::Operator => {
            return Err(deny(
                Rule::OperatorReadOnly,
                format!("the operator may not make a child of {parent}: the operator is read-only on this mount."),
                "remount with --operator read-write".to_owned(),
            ))
        }
        Identity::Smith(s) => {
            let own = smith_path(&full_id(*s, ctx));
            return Err(deny(
                Rule::ScaffoldParentOnly,
                format!(
                    "{} may not make a child of {parent}: only {} itself and the operator may.",
                    full_id(*s, ctx),
                    short(&parent)
                ),
                // The caller's own numbering is not this family's: name the rule, not a number
                // that may be taken already.
                format!(
                    "make your own children with mkdir {own}/children/smith-NNN, numbered above every child you have had (the first is {})",
                    child_name(1)
                ),
            ));
        }
        Identity::Unknown => {
            return Err(deny(
                Rule::UnknownIdentity,
                format!("an unidentified process may not make a child of {parent}: only {} itself and the operator may.", short(&parent)),
                "run it as the operator, or bound to a smith with `smithfs run --smith FULL_ID -- CMD`".to_owned(),
            ))
        }
    }

    // 2. How deep.
    let child_level = u16::from(family.parent_level) + 1;
    let deepest = child_level + u16::from(family.subtree_depth);
    if deepest > u16::from(ctx.limits.max_level) {
        let reach = match family.subtree_depth {
            0 => format!("a child would be at level {child_level}"),
            d => format!(
                "a child at level {child_level} with {d} level{} of smiths below it would reach level {deepest}",
                if d == 1 { "" } else { "s" }
            ),
        };
        return Err(deny(
            Rule::ScaffoldMaxLevel,
            format!(
                "{parent} is at level {} and limits.max_level is {}: {reach}.",
                family.parent_level, ctx.limits.max_level
            ),
            format!("do the work in {dir}/private/, or ask the operator to raise limits.max_level in config.json"),
        ));
    }

    // 3. Which name.
    let number = parse_child_name(name);
    let fresh = match (number, family.highest_used) {
        (Some(n), Some(h)) => n > h,
        (Some(_), None) => true,
        (None, _) => false,
    };
    let Some(number) = number.filter(|_| fresh) else {
        let problem = match number {
            None if is_numbered_name(name) => format!(
                "has a number too large for a child id (the largest is {})",
                child_name(u32::MAX)
            ),
            None => "is not smith-NNN (three or more digits)".to_owned(),
            Some(_) => format!(
                "does not number above every child {} has used (up to {})",
                short(&parent),
                family.highest_used.map_or_else(String::new, child_name)
            ),
        };
        return Err(deny(
            Rule::ScaffoldChildName,
            format!("`{name_text}` {problem}: {next_name}."),
            match next {
                Some(n) => format!("mkdir {dir}/children/{}", child_name(n)),
                None => "give the work to an existing child through its inbox/".to_owned(),
            },
        ));
    };

    // 4. How many.
    let max = ctx.limits.max_children;
    if u64::try_from(family.n_children).unwrap_or(u64::MAX) >= u64::from(max) {
        return Err(deny(
            Rule::ScaffoldMaxChildren,
            format!(
                "{parent} already has {} children and limits.max_children is {max}.",
                family.n_children
            ),
            format!(
                "give more work to an existing child through its inbox/ ({dir}/children/…/inbox/)"
            ),
        ));
    }
    Ok(number)
}

/// The denial of a `mkdir` in `children/` whose child's workspace could not be made (§11; the
/// child is not created): `reason` is git's or the sandbox's error, cut to its first line and
/// 300 characters for `why` (docs/PROTOCOL-NOTES.md W20; the daemon's log has all of it).
pub fn workspace_failed(full_id: &str, reason: &str) -> Denial {
    let reason: String = reason
        .lines()
        .next()
        .unwrap_or("")
        .chars()
        .take(300)
        .collect();
    Rule::ScaffoldWorkspace.deny(
        format!(
            "smithfs could not make the workspace of {full_id}, so the child was not created: \
             {reason}"
        ),
        "fix the cause (the daemon's log has git's whole error) and make the child again".into(),
    )
}
