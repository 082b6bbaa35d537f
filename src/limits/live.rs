//! The limits in force (docs/SPEC.md §8 `limits`), one cell shared by everyone who enforces
//! them, so that `smithfs reload` and SIGHUP (§6) change them without a remount
//! (docs/PROTOCOL-NOTES.md L20).
//!
//! Readers: the filesystem (the scaffold's `max_level`/`max_children` in the policy context of
//! every request, `max_open_files_per_smith` at every open, the storage quotas at every
//! admission and settlement, `whoami`) and the cgroup backend (the limits written into the
//! cgroups of smiths made later). The one writer is the reloader, after it has applied the
//! cgroup limits to every existing smith (`crate::reload`).

use parking_lot::RwLock;

use super::storage::Quota;
use super::CgroupPlan;
use crate::config::Limits;

/// Everything derived from `limits` that is enforced: taken together, so a reader never sees
/// half of a reload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// `limits` of config.json as it was read (docs/SPEC.md §8).
    pub limits: Limits,
    /// The cgroup limits: `per_smith` clamped to `per_subtree` ([`CgroupPlan::new`]).
    pub cgroups: CgroupPlan,
    /// Open handles one smith may hold: `limits.max_open_files_per_smith`, or the share the
    /// descriptor plan gives (`crate::fs::budget::plan`); at least 1.
    pub open_files_per_smith: usize,
}

impl Snapshot {
    /// The snapshot of `limits` with `open_files_per_smith` handles per smith (the descriptor
    /// plan's figure for `limits.max_open_files_per_smith`).
    pub fn new(limits: Limits, open_files_per_smith: usize) -> Snapshot {
        let (cgroups, _) = CgroupPlan::new(limits.per_smith, limits.per_subtree);
        Snapshot {
            limits,
            cgroups,
            open_files_per_smith: open_files_per_smith.max(1),
        }
    }

    /// The storage quota of one smith (`max_bytes_per_smith`, `max_inodes_per_smith`).
    pub fn quota(&self) -> Quota {
        Quota {
            max_bytes: self.limits.max_bytes_per_smith.map(|b| b.bytes()),
            max_inodes: self.limits.max_inodes_per_smith,
        }
    }
}

/// The cell holding the [`Snapshot`] in force.
///
/// A `parking_lot::RwLock` around a small `Copy` value rather than an `ArcSwap`-like pointer
/// swap: readers hold the read lock only to copy the value out (no allocation, no reference
/// count, no syscall), an uncontended read lock is one atomic operation, and the only writer is a
/// reload, which is rare and never waits on a reader for long — so the hot path pays about what
/// an `ArcSwap` load would, without a new dependency. The lock is a leaf: nothing is taken or
/// called while it is held.
#[derive(Debug)]
pub struct LiveLimits {
    now: RwLock<Snapshot>,
}

impl LiveLimits {
    /// A cell holding `snapshot`.
    pub fn new(snapshot: Snapshot) -> LiveLimits {
        LiveLimits {
            now: RwLock::new(snapshot),
        }
    }

    /// The snapshot in force (a copy).
    pub fn get(&self) -> Snapshot {
        *self.now.read()
    }

    /// `limits` in force.
    pub fn limits(&self) -> Limits {
        self.now.read().limits
    }

    /// The storage quota in force.
    pub fn quota(&self) -> Quota {
        self.now.read().quota()
    }

    /// The open handles one smith may hold now.
    pub fn open_files_per_smith(&self) -> usize {
        self.now.read().open_files_per_smith
    }

    /// The cgroup limits in force.
    pub fn cgroups(&self) -> CgroupPlan {
        self.now.read().cgroups
    }

    /// Put `snapshot` in force (a reload); returns the one it replaces.
    pub fn set(&self, snapshot: Snapshot) -> Snapshot {
        std::mem::replace(&mut *self.now.write(), snapshot)
    }
}

impl Default for LiveLimits {
    /// The default limits (docs/SPEC.md §8) and no practical limit on open handles.
    fn default() -> Self {
        LiveLimits::new(Snapshot::new(Limits::default(), 1 << 20))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{CgroupLimits, Size};

    #[test]
    fn a_snapshot_clamps_and_a_reload_replaces_it_whole() {
        let mut l = Limits {
            max_bytes_per_smith: Some(Size(1 << 20)),
            max_inodes_per_smith: Some(10),
            per_smith: CgroupLimits {
                pids_max: Some(100),
                ..CgroupLimits::default()
            },
            per_subtree: CgroupLimits {
                pids_max: Some(50),
                ..CgroupLimits::default()
            },
            ..Limits::default()
        };
        let cell = LiveLimits::new(Snapshot::new(l, 0));
        let s = cell.get();
        assert_eq!(s.open_files_per_smith, 1, "at least one");
        assert_eq!(s.cgroups.per_smith.pids_max, Some(50), "clamped");
        assert_eq!(
            cell.quota(),
            Quota {
                max_bytes: Some(1 << 20),
                max_inodes: Some(10)
            }
        );
        l.max_children = 1;
        l.max_bytes_per_smith = None;
        let old = cell.set(Snapshot::new(l, 7));
        assert_eq!(old, s);
        assert_eq!(cell.limits().max_children, 1);
        assert_eq!(cell.quota().max_bytes, None);
        assert_eq!(cell.open_files_per_smith(), 7);
    }
}
