//! Applying a scaffold plan (`tree::scaffold_plan`) to the backing store: a smith dir appears whole
//! or not at all (docs/SPEC.md §4).

use std::ffi::CStr;
use std::os::fd::BorrowedFd;

use super::backing::{self, Node, SysResult};
use crate::tree::scaffold_plan::{Plan, PlanEntry, DIR_MODE};

/// Create the smith dir `name` in `dir` (a `children/` or `smiths/` directory) from `plan`,
/// built under a temporary name and renamed into place. `owner` (uid, gid) owns every entry.
/// `finish` (see [`backing::build_tree`]) completes the tree under its temporary name: the
/// workspace's git step (docs/SPEC.md §11).
///
/// Errors: EEXIST if `name` exists; the errno of any failing call (nothing is left behind).
pub fn create_smith_dir(
    dir: BorrowedFd<'_>,
    name: &CStr,
    plan: &Plan,
    owner: Option<(u32, u32)>,
    finish: Option<&mut backing::Finish<'_>>,
) -> SysResult<()> {
    let nodes: Vec<Node<'_>> = plan
        .entries
        .iter()
        .map(|e| match e {
            PlanEntry::Dir { path, mode } => Node::Dir(path, *mode),
            PlanEntry::File {
                path,
                mode,
                content,
            } => Node::File(path, *mode, content),
        })
        .collect();
    backing::build_tree(dir, name, DIR_MODE, &nodes, owner, finish)
}
