//! The daemon's descriptor budget (issue 6: "one smith must not take the mount down").
//!
//! Every open file or directory handle costs the daemon one descriptor, taken from the same
//! `RLIMIT_NOFILE` as the inode cache, the identity cache (one pidfd per live caller) and the
//! daemon's own work (journal, logs, cgroups, runs, `/dev/fuse`). [`plan`] splits the limit
//! between them; [`OpenLimits`] enforces the handles' share at open time: at most
//! [`FdPlan::per_smith`] handles per smith (`limits.max_open_files_per_smith`, EMFILE beyond)
//! and at most [`FdPlan::handles`] for everybody together, the operator included (ENFILE
//! beyond), so the reserve is never touched by opens. Counting is lock-free: one atomic per
//! smith and one for the mount; the map from smith to counter is read-locked only to find it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;
use rustc_hash::FxHashMap;

use crate::identity::Identity;
use crate::limits::live::{LiveLimits, Snapshot};
use crate::tree::model::SmithIdx;

/// Descriptors always kept for the daemon's own work, at least: journal, logs, the lock, one
/// cgroup per smith, `/dev/fuse` clones, runs and hooks, transient opens (`/proc`, the
/// scaffold, passthrough registration, ancestry walks).
pub const MIN_RESERVE: usize = 256;

/// Largest identity cache (pidfds of callers), as [`crate::identity::resolve`] has it.
pub const MAX_IDENTITY_CACHE: usize = crate::identity::resolve::DEFAULT_CACHE_CAPACITY;

/// How the daemon's descriptors are shared out (see the module header). Every field is a
/// number of descriptors; `reserve + identity_cache + inode_cache + handles <= nofile` whenever
/// `nofile` is at least a few hundred.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FdPlan {
    /// The soft `RLIMIT_NOFILE` the plan divides.
    pub nofile: usize,
    /// Kept for the daemon's own work: a sixteenth, at least [`MIN_RESERVE`].
    pub reserve: usize,
    /// Cap of the identity cache: a quarter, at most [`MAX_IDENTITY_CACHE`].
    pub identity_cache: usize,
    /// Cap of the cached inode descriptors (`O_PATH`, reopened by file handle beyond it).
    pub inode_cache: usize,
    /// Open file and directory handles of everybody together.
    pub handles: usize,
    /// Open handles of one smith: `limits.max_open_files_per_smith`, by default an eighth of
    /// `handles`.
    pub per_smith: usize,
}

/// Splits a soft `RLIMIT_NOFILE` of `nofile` (pure): the reserve and the identity cache first,
/// then what is left half to open handles and half to the inode cache; `per_smith` is the
/// configured `limits.max_open_files_per_smith`, or `None` for an eighth of the handles.
pub fn plan(nofile: u64, per_smith: Option<u32>) -> FdPlan {
    let nofile = usize::try_from(nofile).unwrap_or(usize::MAX);
    let reserve = (nofile / 16).max(MIN_RESERVE);
    let identity_cache = (nofile / 4).clamp(16, MAX_IDENTITY_CACHE);
    let rest = nofile
        .saturating_sub(reserve)
        .saturating_sub(identity_cache);
    let handles = (rest / 2).max(16);
    let inode_cache = (rest - rest / 2).max(64);
    let per_smith = match per_smith {
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX).max(1),
        None => (handles / 8).max(8),
    };
    FdPlan {
        nofile,
        reserve,
        identity_cache,
        inode_cache,
        handles,
        per_smith,
    }
}

/// Open handles counted against one limit.
#[derive(Debug, Default)]
struct Count {
    open: AtomicUsize,
    /// A refusal was journaled since the count was last well below the limit (one journal
    /// line per episode; `.smithfs/why` is updated on every refusal).
    refused: AtomicBool,
}

impl Count {
    /// Takes one unit if fewer than `limit` are taken.
    fn take(&self, limit: usize) -> bool {
        let before = self.open.fetch_add(1, Ordering::AcqRel);
        if before < limit {
            true
        } else {
            self.open.fetch_sub(1, Ordering::AcqRel);
            false
        }
    }

    /// Gives one unit back; re-arms the journal once a quarter of `limit` is free again.
    fn give(&self, limit: usize) {
        let after = self.open.fetch_sub(1, Ordering::AcqRel).saturating_sub(1);
        if after <= limit - limit / 4 && self.refused.load(Ordering::Relaxed) {
            self.refused.store(false, Ordering::Relaxed);
        }
    }

    /// True for the first refusal of an episode.
    fn first_refusal(&self) -> bool {
        !self.refused.swap(true, Ordering::Relaxed)
    }
}

/// Why an open was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The smith holds `limit` handles already: EMFILE.
    Smith {
        /// Its limit (`limits.max_open_files_per_smith`).
        limit: usize,
    },
    /// Everybody together holds `limit` handles: ENFILE.
    Mount {
        /// The mount-wide limit ([`FdPlan::handles`]).
        limit: usize,
    },
}

/// A refused open: the reason, and whether it is the first of its episode (to journal).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refused {
    /// The reason.
    pub why: Refusal,
    /// First refusal since the count was last well below the limit.
    pub first: bool,
}

/// One open handle's share of the budget, given back when dropped (with the handle, so with
/// its descriptor).
#[derive(Debug)]
pub struct Slot {
    total: Arc<Count>,
    total_limit: usize,
    smith: Option<(Arc<Count>, usize)>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some((c, limit)) = &self.smith {
            c.give(*limit);
        }
        self.total.give(self.total_limit);
    }
}

/// The limits on open handles of one mount (see the module header). The limit per smith is
/// read from the mount's live limits at every open, so a reload changes it at once: handles
/// already open stay open when it is lowered, and only new opens beyond it are refused
/// (docs/PROTOCOL-NOTES.md L20).
#[derive(Debug)]
pub struct OpenLimits {
    live: Arc<LiveLimits>,
    total_limit: usize,
    total: Arc<Count>,
    smiths: RwLock<FxHashMap<SmithIdx, Arc<Count>>>,
}

impl OpenLimits {
    /// At most `per_smith` handles per smith and `total` for everybody (both at least 1), fixed.
    pub fn new(per_smith: usize, total: usize) -> OpenLimits {
        let live = LiveLimits::new(Snapshot::new(crate::config::Limits::default(), per_smith));
        OpenLimits::with_live(Arc::new(live), total)
    }

    /// At most [`LiveLimits::open_files_per_smith`] handles per smith, as it is at each open,
    /// and `total` (at least 1) for everybody.
    pub fn with_live(live: Arc<LiveLimits>, total: usize) -> OpenLimits {
        OpenLimits {
            live,
            total_limit: total.max(1),
            total: Arc::default(),
            smiths: RwLock::default(),
        }
    }

    /// The limit per smith now.
    pub fn per_smith(&self) -> usize {
        self.live.open_files_per_smith()
    }

    /// The mount-wide limit.
    pub fn total(&self) -> usize {
        self.total_limit
    }

    /// Handles open now: everybody's, and `smith`'s if given.
    pub fn open_now(&self, smith: Option<SmithIdx>) -> (usize, Option<usize>) {
        let total = self.total.open.load(Ordering::Relaxed);
        let mine = smith.map(|s| {
            self.smiths
                .read()
                .get(&s)
                .map_or(0, |c| c.open.load(Ordering::Relaxed))
        });
        (total, mine)
    }

    fn counter(&self, smith: SmithIdx) -> Arc<Count> {
        if let Some(c) = self.smiths.read().get(&smith) {
            return Arc::clone(c);
        }
        Arc::clone(self.smiths.write().entry(smith).or_default())
    }

    /// Takes a slot for one more handle opened by `who`: a smith is held to its own limit and
    /// the mount's, anybody else to the mount's.
    ///
    /// # Errors
    /// [`Refused`] when a limit is reached; nothing is taken then.
    pub fn charge(&self, who: Identity) -> Result<Slot, Refused> {
        let smith = match who {
            Identity::Smith(s) => {
                let limit = self.per_smith();
                let c = self.counter(s);
                if !c.take(limit) {
                    return Err(Refused {
                        why: Refusal::Smith { limit },
                        first: c.first_refusal(),
                    });
                }
                Some((c, limit))
            }
            Identity::Operator | Identity::Unknown => None,
        };
        if !self.total.take(self.total_limit) {
            if let Some((c, limit)) = &smith {
                c.give(*limit);
            }
            return Err(Refused {
                why: Refusal::Mount {
                    limit: self.total_limit,
                },
                first: self.total.first_refusal(),
            });
        }
        Ok(Slot {
            total: Arc::clone(&self.total),
            total_limit: self.total_limit,
            smith,
        })
    }

    /// Forgets the counter of a removed smith (its open handles still give back their slots).
    pub fn forget(&self, smith: SmithIdx) {
        self.smiths.write().remove(&smith);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_table() {
        // nofile, configured per smith → reserve, identity cache, inode cache, handles, per smith
        let rows: &[(u64, Option<u32>, [usize; 5])] = &[
            (20_000, None, [1250, 4096, 7327, 7327, 915]),
            (20_000, Some(100), [1250, 4096, 7327, 7327, 100]),
            (1_048_576, None, [65536, 4096, 489_472, 489_472, 61184]),
            (
                1_048_576,
                Some(5_000_000),
                [65536, 4096, 489_472, 489_472, 5_000_000],
            ),
            (4096, None, [256, 1024, 1408, 1408, 176]),
            (1024, None, [256, 256, 256, 256, 32]),
            (256, None, [256, 64, 64, 16, 8]),
            (0, None, [256, 16, 64, 16, 8]),
            (0, Some(0), [256, 16, 64, 16, 1]),
        ];
        for (nofile, cfg, want) in rows {
            let p = plan(*nofile, *cfg);
            assert_eq!(
                [
                    p.reserve,
                    p.identity_cache,
                    p.inode_cache,
                    p.handles,
                    p.per_smith
                ],
                *want,
                "nofile {nofile}, configured {cfg:?}"
            );
            if *nofile >= 1024 {
                assert!(
                    p.reserve + p.identity_cache + p.inode_cache + p.handles <= p.nofile,
                    "{p:?} overcommits"
                );
            }
        }
    }

    #[test]
    fn a_smith_is_held_to_its_limit_and_everybody_to_the_mount() {
        let l = OpenLimits::new(3, 5);
        let a = Identity::Smith(SmithIdx(1));
        let b = Identity::Smith(SmithIdx(2));
        let mut held: Vec<Slot> = (0..3).map(|_| l.charge(a).expect("a")).collect();
        let e = l.charge(a).expect_err("a is at its limit");
        assert_eq!(e.why, Refusal::Smith { limit: 3 });
        assert!(e.first, "the first refusal is journaled");
        assert!(!l.charge(a).expect_err("still").first, "then not again");
        assert_eq!(l.open_now(Some(SmithIdx(1))), (3, Some(3)));
        // Another smith is not affected by a's refusals.
        held.push(l.charge(b).expect("b"));
        held.push(l.charge(Identity::Operator).expect("operator"));
        // The mount is full: b (under its own limit) and the operator get the mount refusal,
        // and a refused smith takes nothing.
        let e = l.charge(b).expect_err("mount full");
        assert_eq!(e.why, Refusal::Mount { limit: 5 });
        assert_eq!(l.open_now(Some(SmithIdx(2))), (5, Some(1)));
        assert!(l.charge(Identity::Operator).is_err());
        // Releasing gives the slots back to both counts.
        held.truncate(1);
        assert_eq!(l.open_now(Some(SmithIdx(1))), (1, Some(1)));
        assert!(l.charge(a).is_ok_and(|s| {
            drop(s);
            true
        }));
        // Well below the limit again: the next refusal is journaled again.
        let again: Vec<Slot> = (0..2).map(|_| l.charge(a).expect("a")).collect();
        assert!(l.charge(a).expect_err("a full again").first);
        drop(again);
        drop(held);
        assert_eq!(l.open_now(Some(SmithIdx(1))), (0, Some(0)));
        l.forget(SmithIdx(1));
        assert_eq!(l.open_now(Some(SmithIdx(1))), (0, Some(0)));
    }

    #[test]
    fn slots_outlive_a_forgotten_smith() {
        let l = OpenLimits::new(2, 10);
        let a = Identity::Smith(SmithIdx(7));
        let s = l.charge(a).expect("a");
        l.forget(SmithIdx(7));
        drop(s);
        assert_eq!(l.open_now(None), (0, None));
    }
}
