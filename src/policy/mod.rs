//! The access policy (docs/SPEC.md §3–§4): pure decisions over identity, operation and zone.
//!
//! [`zone`] says where an entry sits (owner and area, kept on every inode); [`rules`] decides an operation
//! there ([`decide`] → [`Decision::Allow`] or [`Decision::Deny`] with errno, rule id and sentences);
//! [`children`] admits a new child for the scaffold (docs/SPEC.md §4); [`moves`] decides the operator's
//! rename of a smith dir (into a `children/`, or out of the tree as data). Nothing here touches the
//! filesystem or a process: the module imports only types.

pub mod children;
pub mod control;
pub mod moves;
pub mod rules;
pub mod zone;

#[cfg(test)]
mod tests;

pub use crate::config::{Limits, OperatorMode};
pub use children::{check_new_child, workspace_failed, Family};
pub use control::{
    bind_failed, ctl_syntax, decide_control_open, decide_ctl, decide_reload,
    decide_rename_whiteout, open_budget_denial, reload_refused, reserved_name, storage_denial,
    CtlAnswer, CtlVerb, Held, OpenBudget, StorageBound,
};
pub use moves::{decide_smith_dir_move, MoveTo, SmithDirMove};
pub use rules::{
    decide, decide_all, decide_link, decide_linked_rename, decide_rename, decide_unseen_names,
    relation, rights, Caller, Ctx, Decision, Denial, Names, NewKind, NoNames, Op, OpClass,
    Relation, Removal, Rights, Rule,
};
pub use zone::{classify, Area, Depth, RootArea, SmithRef, SmithZone, Zone};
