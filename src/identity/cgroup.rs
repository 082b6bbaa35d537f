//! The cgroup v2 side of identity (docs/SPEC.md §2, cgroup mode): where the cgroup2 hierarchy is,
//! the cgroups smithfs creates, and the few operations on them (move a process in, list, signal,
//! kill, remove).
//!
//! Layout (nested; see docs/PROTOCOL-NOTES.md, L1):
//! ```text
//! <cgroup2 mount><the daemon's own cgroup>/smithfs-<daemon pid>/   the parent, created by the daemon
//!     smith-root/                      the root smith's node: subtree limits, never a process
//!         self/                        its leaf: the smith's own processes (identity, per-smith limits)
//!         smith-001/                   a child's node, same shape
//!             self/
//!             smith-002/ …
//!     operator/                        user hooks, bound as the operator (docs/SPEC.md §5)
//! ```
//! A smith's node is `<parent>/<its full id>` (the full id's `/` are directory levels); its
//! identity is its `self/` leaf's cgroup id. Hybrid hosts mirror the tree in the v1 limit
//! hierarchies ([`crate::limits::cgroup`]).
//! Nothing outside the parent is ever created, written or removed. The cgroup id that
//! `PIDFD_GET_INFO` reports for a task is the inode number of its cgroup directory.
//!
//! The primitives (a cgroup directory, its operations, its ownership by `flock`) are
//! [`crate::sys::cgroup`]'s.

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::sys::cgroup::{claimed, is_parent_name, Cgroup, OPERATOR_CGROUP, SELF_CGROUP};

/// The node of a smith relative to the parent cgroup: its full id as a path
/// (`smith-root/smith-001`). `None` if `full_id` is not `smith-root(/smith-NNN)*`, so no
/// component can be `.`, `..`, [`SELF_CGROUP`] or [`OPERATOR_CGROUP`].
pub fn smith_node_rel(full_id: &str) -> Option<PathBuf> {
    crate::tree::model::FullId::parse(full_id).map(|f| PathBuf::from(f.as_str()))
}

/// Kill everything a dead daemon left under its parent cgroup `parent` (a `smithfs-*` directory
/// no live daemon claims, see [`claimed`]): one `cgroup.kill` of the parent kills its whole
/// subtree; wait up to `wait` for it to empty, and remove the tree bottom-up, with its v1
/// mirrors ([`crate::limits::cgroup::remove_v1_mirrors`]). Nothing happens when `parent` is
/// claimed, is not a `smithfs-*` directory under `/sys/fs/cgroup`, or does not exist. This
/// catches a run the dead daemon started but did not journal yet (docs/SPEC.md §6: kill what is
/// left of runs). Returns how many smith leaves still had processes.
pub fn kill_dead_parent(parent: &Path, wait: Duration) -> usize {
    let named = parent.file_name().is_some_and(is_parent_name);
    let plain = parent.is_absolute()
        && parent.starts_with("/sys/fs/cgroup")
        && !parent.components().any(|c| c.as_os_str() == "..");
    if !named || !plain || !parent.is_dir() || claimed(parent) {
        return 0;
    }
    let Ok(cg) = Cgroup::open_existing(parent) else {
        return 0;
    };
    let killed = populated_leaves(parent);
    if cg.populated().unwrap_or(false) {
        let _ = cg.kill_all();
        cg.wait_empty(wait);
    }
    crate::sys::cgroup::remove_tree(parent);
    if let Some(name) = parent.file_name() {
        crate::limits::cgroup::remove_v1_mirrors(name);
    }
    killed
}

/// How many `self/` (and `operator`) leaves under `dir` have processes.
fn populated_leaves(dir: &Path) -> usize {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| e.path().is_dir() && is_ours(&e.file_name()))
        .map(|e| {
            let leaf = e.file_name() == SELF_CGROUP || e.file_name() == OPERATOR_CGROUP;
            if leaf {
                usize::from(
                    fs::read_to_string(e.path().join("cgroup.events"))
                        .is_ok_and(|t| t.lines().any(|l| l.trim() == "populated 1")),
                )
            } else {
                populated_leaves(&e.path())
            }
        })
        .sum()
}

/// True if `name` is a cgroup name this module creates under the parent or a node:
/// [`OPERATOR_CGROUP`], [`SELF_CGROUP`], `smith-root` or `smith-NNN`.
pub fn is_ours(name: &OsStr) -> bool {
    name == OPERATOR_CGROUP
        || name == SELF_CGROUP
        || name == "smith-root"
        || name
            .to_str()
            .is_some_and(|n| smith_node_rel(&format!("smith-root/{n}")).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smith_names() {
        assert_eq!(
            smith_node_rel("smith-root"),
            Some(PathBuf::from("smith-root"))
        );
        assert_eq!(
            smith_node_rel("smith-root/smith-001/smith-1000"),
            Some(PathBuf::from("smith-root/smith-001/smith-1000"))
        );
        for bad in [
            "",
            "operator",
            "smith-root/..",
            "smith-root/",
            "a/smith-001",
            "smith-root/smith-1",
            "smith-root/self",
        ] {
            assert_eq!(smith_node_rel(bad), None, "{bad}");
        }
        for ours in ["operator", "self", "smith-root", "smith-002", "smith-1000"] {
            assert!(is_ours(OsStr::new(ours)), "{ours}");
        }
        for other in ["system.slice", "smith-root.smith-002", "smith-1", "selfish"] {
            assert!(!is_ours(OsStr::new(other)), "{other}");
        }
    }
}
