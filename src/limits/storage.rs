//! Storage quotas (docs/SPEC.md §8, `limits.max_bytes_per_smith` and
//! `limits.max_inodes_per_smith`): who pays for an entry of the store, the books of what each
//! smith holds, the admission of a change, and the scan that rebuilds the books at mount.
//!
//! The model (docs/PROTOCOL-NOTES.md, L9–L12):
//! - An entry is charged by *where it is* ([`payer`]): what lies inside X's `private/`,
//!   `outbox/`, `workspace/`, `conversations/` (its runs' directories, `meta.json` and
//!   `messages.log`, written by the daemon), and every other name X made directly in its smith
//!   dir (`CLAUDE.md`, `.git/…`), costs X; a task in X's `inbox/`, X's `config.json` and what is
//!   in X's `.claude/` cost X's parent (who writes them; docs/SPEC.md §8: "a task a parent writes
//!   into a child's inbox counts for the parent"); the structure (smith dirs, area directories,
//!   `smith.md`) and everything outside `smiths/` cost nobody. So the books are a function of
//!   the store alone, and a scan can always rebuild them.
//! - An inode is charged once, to one smith, whatever its number of names: *allocated* bytes
//!   (`st_blocks × 512`, so a sparse file costs its data, a directory its blocks) and one inode.
//! - The books are kept exact by re-reading `st_blocks` after every change the daemon makes
//!   for a caller and applying the difference ([`Books::record`]), never by predicting it; only
//!   the admission of a change ([`Books::admit`]) uses an estimate of what it will add.
//! - An unlinked inode the kernel still holds (an open file) keeps its charge until the daemon
//!   lets go of it ([`Books::unlinked`], [`Books::forgotten`]).
//!
//! Pure but for [`scan`], which reads the store through `crate::backing`.
//!
//! Long on purpose: the payer rule, the books, admission and the scan are one model whose
//! table tests (the last third of the file) check them against each other.

use std::ffi::CString;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use crate::backing::{self, BackingIno, SysResult};
use crate::policy::zone::{Area, Depth, RootArea, Zone};
use crate::policy::{Held, StorageBound};
use crate::tree::model::SmithIdx;

/// Bytes in one unit of `st_blocks` (POSIX: 512 whatever the filesystem's block size).
pub const BLOCK: u64 = 512;

/// Where a charged entry lives and who pays for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Home {
    /// The smith charged for it.
    pub payer: SmithIdx,
    /// The smith whose dir holds it (the payer, or the payer's child for its inbox, config and
    /// `.claude/`).
    pub smith: SmithIdx,
    /// The area of that smith dir it is in.
    pub area: Area,
}

/// Who pays for an entry of zone `zone` (see the module docs), or `None` when it costs nobody.
pub fn payer(zone: &Zone) -> Option<Home> {
    let Zone::Smith(z) = zone else {
        return None;
    };
    let payer = match (z.area, z.depth) {
        (
            Area::Private | Area::Outbox | Area::Workspace | Area::Conversations | Area::Home,
            Depth::Inner,
        )
        | (Area::Other, _) => Some(z.owner),
        (Area::Inbox | Area::Claude, Depth::Inner) | (Area::Config, _) => z.owner_parent,
        (
            Area::SmithDir
            | Area::SmithMd
            | Area::Children
            | Area::Private
            | Area::Outbox
            | Area::Workspace
            | Area::Conversations
            | Area::Inbox
            | Area::Claude
            | Area::Home,
            _,
        ) => None,
    };
    payer.map(|payer| Home {
        payer,
        smith: z.owner,
        area: z.area,
    })
}

/// The name of the daemon's copy of the root's result in `results/` (docs/SPEC.md §5): written
/// by smithfs alone, so it costs nobody wherever it is in `results/`.
const FINAL: &[u8] = b"final.md";

/// Who pays for the entry `name` of zone `zone` when `root` is the root smith: [`payer`], and
/// also `results/**` — written by the root smith alone among smiths (docs/SPEC.md §3), so it
/// costs the root (docs/PROTOCOL-NOTES.md L9) — but for the daemon's `final.md` and its
/// temporary files while it writes one. `name` is
/// `None` where it is not known (the admission of a write to an open file): then every entry of
/// `results/` costs the root.
pub fn payer_in(zone: &Zone, name: Option<&[u8]>, root: Option<SmithIdx>) -> Option<Home> {
    match zone {
        Zone::Outside {
            area: RootArea::Results,
            depth: Depth::Inner,
        } if !name.is_some_and(|n| n == FINAL || backing::is_daemon_temp(n)) => {
            root.map(|r| Home {
                payer: r,
                smith: r,
                // Outside every smith dir: the root's "other" files.
                area: Area::Other,
            })
        }
        _ => payer(zone),
    }
}

/// What one smith holds: allocated bytes and inodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Usage {
    /// Allocated bytes (`st_blocks × 512` summed over its inodes).
    pub bytes: u64,
    /// Inodes (files, directories, symlinks … counted once whatever their number of names).
    pub inodes: u64,
}

/// The limits of one smith (docs/SPEC.md §8); `None`: no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Quota {
    /// `limits.max_bytes_per_smith`.
    pub max_bytes: Option<u64>,
    /// `limits.max_inodes_per_smith`.
    pub max_inodes: Option<u64>,
}

impl Quota {
    /// Is any limit set (the books are kept only then)?
    pub fn is_set(&self) -> bool {
        self.max_bytes.is_some() || self.max_inodes.is_some()
    }
}

/// One charged inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Charge {
    home: Home,
    /// `st_blocks` last seen.
    blocks: u64,
    /// No name is left, but the daemon still holds it (an open or looked-up unlinked file).
    orphan: bool,
}

/// The books: every charged inode (by backing inode number) and each payer's total.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Books {
    charges: FxHashMap<BackingIno, Charge>,
    usage: FxHashMap<SmithIdx, Usage>,
}

impl Books {
    /// Empty books.
    pub fn new() -> Books {
        Books::default()
    }

    /// What `smith` holds.
    pub fn usage(&self, smith: SmithIdx) -> Usage {
        self.usage.get(&smith).copied().unwrap_or_default()
    }

    /// Where `payer`'s charges lie, in allocated bytes and inodes per place (for the `why` of
    /// a quota denial): one pass over the books.
    pub fn held(&self, payer: SmithIdx) -> Vec<(Held, Usage)> {
        let mut out: Vec<(Held, Usage)> = Vec::new();
        for c in self.charges.values().filter(|c| c.home.payer == payer) {
            let place = if c.orphan {
                Held::Unlinked
            } else if c.home.smith != payer {
                Held::ForChildren
            } else {
                Held::Own(c.home.area)
            };
            let i = match out.iter().position(|(p, _)| *p == place) {
                Some(i) => i,
                None => {
                    out.push((place, Usage::default()));
                    out.len() - 1
                }
            };
            out[i].1.bytes += c.blocks.saturating_mul(BLOCK);
            out[i].1.inodes += 1;
        }
        out
    }

    /// Every payer with a nonzero total, sorted by index (for comparisons and status).
    pub fn totals(&self) -> Vec<(SmithIdx, Usage)> {
        let mut v: Vec<(SmithIdx, Usage)> = self
            .usage
            .iter()
            .filter(|(_, u)| **u != Usage::default())
            .map(|(s, u)| (*s, *u))
            .collect();
        v.sort_by_key(|(s, _)| s.0);
        v
    }

    /// Is inode `ino` charged?
    pub fn is_charged(&self, ino: BackingIno) -> bool {
        self.charges.contains_key(&ino)
    }

    fn add(&mut self, smith: SmithIdx, blocks: u64, inodes: u64) {
        let u = self.usage.entry(smith).or_default();
        u.bytes = u.bytes.saturating_add(blocks.saturating_mul(BLOCK));
        u.inodes = u.inodes.saturating_add(inodes);
    }

    fn sub(&mut self, smith: SmithIdx, blocks: u64, inodes: u64) {
        if let Some(u) = self.usage.get_mut(&smith) {
            u.bytes = u.bytes.saturating_sub(blocks.saturating_mul(BLOCK));
            u.inodes = u.inodes.saturating_sub(inodes);
            if *u == Usage::default() {
                self.usage.remove(&smith);
            }
        }
    }

    /// Inode `ino` lives at `home` (`None`: it costs nobody) with `blocks` allocated (its
    /// `st_blocks` just read): charge it, move it to a new payer, or apply the difference to
    /// what was recorded. Returns the change of the payer's bytes (negative when space came
    /// back).
    pub fn record(&mut self, ino: BackingIno, home: Option<Home>, blocks: u64) -> i64 {
        let old = self.charges.get(&ino).copied();
        match (old, home) {
            (None, None) => 0,
            (Some(c), None) => {
                self.charges.remove(&ino);
                self.sub(c.home.payer, c.blocks, 1);
                -((c.blocks * BLOCK) as i64)
            }
            (None, Some(h)) => {
                self.charges.insert(
                    ino,
                    Charge {
                        home: h,
                        blocks,
                        orphan: false,
                    },
                );
                self.add(h.payer, blocks, 1);
                (blocks * BLOCK) as i64
            }
            (Some(c), Some(h)) => {
                if c.home.payer != h.payer {
                    self.sub(c.home.payer, c.blocks, 1);
                    self.add(h.payer, blocks, 1);
                } else if blocks >= c.blocks {
                    self.add(h.payer, blocks - c.blocks, 0);
                } else {
                    self.sub(h.payer, c.blocks - blocks, 0);
                }
                self.charges.insert(
                    ino,
                    Charge {
                        home: h,
                        blocks,
                        orphan: false,
                    },
                );
                (blocks as i64 - c.blocks as i64) * BLOCK as i64
            }
        }
    }

    /// Inode `ino` now has `blocks` allocated, wherever it lives (a write, truncate or
    /// fallocate through a handle). Unknown inodes are left alone. Returns the change in bytes.
    pub fn resize(&mut self, ino: BackingIno, blocks: u64) -> i64 {
        match self.charges.get(&ino).copied() {
            Some(c) => {
                let orphan = c.orphan;
                let d = self.record(ino, Some(c.home), blocks);
                if let Some(c) = self.charges.get_mut(&ino) {
                    c.orphan = orphan;
                }
                d
            }
            None => 0,
        }
    }

    /// Where inode `ino` is charged, if it is.
    pub fn home(&self, ino: BackingIno) -> Option<Home> {
        self.charges.get(&ino).map(|c| c.home)
    }

    /// Inode `ino` now lives at `home` (a rename): charged to its new payer with the blocks
    /// recorded; an inode not charged yet is left for the next settle.
    pub fn rehome(&mut self, ino: BackingIno, home: Option<Home>) {
        if let Some(c) = self.charges.get(&ino).copied() {
            self.record(ino, home, c.blocks);
            if let Some(n) = self.charges.get_mut(&ino) {
                n.orphan = c.orphan;
            }
        }
    }

    /// Take every charge of `found` (a scan of part of the store) as it is.
    pub fn absorb(&mut self, found: &Books) {
        for (ino, c) in &found.charges {
            self.record(*ino, Some(c.home), c.blocks);
        }
    }

    /// Replace the books by `fresh` (a scan of the whole store), keeping the orphans (unlinked
    /// inodes the daemon still holds, which no scan can see).
    pub fn replace_all(&mut self, fresh: Books) {
        let orphans: Vec<(BackingIno, Charge)> = self
            .charges
            .iter()
            .filter(|(ino, c)| c.orphan && !fresh.charges.contains_key(ino))
            .map(|(i, c)| (*i, *c))
            .collect();
        *self = fresh;
        for (ino, c) in orphans {
            self.charges.insert(ino, c);
            self.add(c.home.payer, c.blocks, 1);
        }
    }

    /// The books without orphans (what a scan of the store can see), to compare with a scan.
    pub fn visible(&self) -> Books {
        let mut b = self.clone();
        let orphans: Vec<BackingIno> = b
            .charges
            .iter()
            .filter(|(_, c)| c.orphan)
            .map(|(i, _)| *i)
            .collect();
        for ino in orphans {
            b.record(ino, None, 0);
        }
        b
    }

    /// A name of inode `ino` was removed and `nlink` names are left. With none left the charge
    /// goes at once, unless the daemon still `held` the inode (it is open, or the kernel still
    /// references it): then it stays until [`Books::forgotten`].
    pub fn unlinked(&mut self, ino: BackingIno, nlink: u64, held: bool) {
        if nlink > 0 {
            return;
        }
        if held {
            if let Some(c) = self.charges.get_mut(&ino) {
                c.orphan = true;
            }
        } else {
            self.record(ino, None, 0);
        }
    }

    /// The daemon let go of inode `ino` (the kernel forgot it): an orphan's space comes back.
    pub fn forgotten(&mut self, ino: BackingIno) {
        if self.charges.get(&ino).is_some_and(|c| c.orphan) {
            self.record(ino, None, 0);
        }
    }

    /// May `smith` add `bytes` (an estimate) and `inodes` under `quota`? A change that adds
    /// nothing is always admitted, so a smith at its limit can still delete, shrink and
    /// overwrite.
    ///
    /// # Errors
    /// The first limit the change would pass.
    pub fn admit(
        &self,
        smith: SmithIdx,
        bytes: u64,
        inodes: u64,
        quota: Quota,
    ) -> Result<(), StorageBound> {
        let u = self.usage(smith);
        if let Some(limit) = quota.max_inodes {
            if inodes > 0 && u.inodes.saturating_add(inodes) > limit {
                return Err(StorageBound::Inodes {
                    limit,
                    used: u.inodes,
                });
            }
        }
        if let Some(limit) = quota.max_bytes {
            if bytes > 0 && u.bytes.saturating_add(bytes) > limit {
                return Err(StorageBound::Bytes {
                    limit,
                    used: u.bytes,
                    asked: bytes,
                });
            }
        }
        Ok(())
    }

    /// Replace what the books say of the entries living in `area` of `smith`'s dir by `found`
    /// (a fresh scan of that area): after the daemon wrote there itself (a scaffold, a
    /// workspace commit). Orphans are kept.
    pub fn replace_area(&mut self, smith: SmithIdx, area: Area, found: &Books) {
        let stale: Vec<BackingIno> = self
            .charges
            .iter()
            .filter(|(ino, c)| {
                c.home.smith == smith
                    && c.home.area == area
                    && !c.orphan
                    && !found.charges.contains_key(ino)
            })
            .map(|(ino, _)| *ino)
            .collect();
        for ino in stale {
            self.record(ino, None, 0);
        }
        for (ino, c) in &found.charges {
            self.record(*ino, Some(c.home), c.blocks);
        }
    }
}

/// The books of a mount behind one lock (a leaf: never held across a syscall, but for the
/// one scan that builds them, [`Storage::ledger_or_build`]).
#[derive(Debug, Default)]
pub struct Ledger {
    books: Mutex<Books>,
}

impl Ledger {
    /// A ledger with the books `books` (from [`scan`]).
    pub fn new(books: Books) -> Ledger {
        Ledger {
            books: Mutex::new(books),
        }
    }

    /// Run `f` on the books.
    pub fn with<R>(&self, f: impl FnOnce(&mut Books) -> R) -> R {
        f(&mut self.books.lock())
    }

    /// What `smith` holds.
    pub fn usage(&self, smith: SmithIdx) -> Usage {
        self.books.lock().usage(smith)
    }

    /// [`Books::held`] of `payer`.
    pub fn held(&self, payer: SmithIdx) -> Vec<(Held, Usage)> {
        self.books.lock().held(payer)
    }

    /// A copy of the books (to compare with a scan).
    pub fn snapshot(&self) -> Books {
        self.books.lock().clone()
    }
}

/// The part of the store kept for the daemon's own writes (the journal, scaffolds,
/// `results/final.md`, workspaces, state; docs/SPEC.md §8): smiths' writes through the daemon
/// fail once they would leave less free than this (docs/PROTOCOL-NOTES.md, L12).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reserve {
    /// Bytes: a 32nd of the store, at least 4 MiB and at most 1 GiB.
    pub bytes: u64,
    /// Inodes: a 32nd of the store's, at least 64 and at most 65 536 (0 on a filesystem that
    /// reports no inode count).
    pub inodes: u64,
}

/// What `statvfs` says of the store, as [`Reserve`] needs it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreSpace {
    /// Size in bytes (`f_blocks × f_frsize`).
    pub total_bytes: u64,
    /// Bytes an unprivileged writer may still allocate (`f_bavail × f_frsize`).
    pub free_bytes: u64,
    /// Inodes (`f_files`; 0: not reported).
    pub total_inodes: u64,
    /// Inodes an unprivileged writer may still use (`f_favail`).
    pub free_inodes: u64,
}

impl StoreSpace {
    /// From a `statvfs` of the store.
    pub fn from_statvfs(st: &libc::statvfs) -> StoreSpace {
        let frsize = if st.f_frsize > 0 {
            st.f_frsize
        } else {
            st.f_bsize
        };
        StoreSpace {
            total_bytes: st.f_blocks.saturating_mul(frsize),
            free_bytes: st.f_bavail.saturating_mul(frsize),
            total_inodes: st.f_files,
            free_inodes: st.f_favail,
        }
    }
}

/// Why [`Reserve::admit`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BelowReserve {
    /// Free bytes or inodes.
    pub free: u64,
    /// The reserve.
    pub reserve: u64,
    /// Counted in inodes.
    pub inodes: bool,
}

impl Reserve {
    /// Free space of at least four reserves and one GiB more is *ample*: smiths' files opened
    /// for writing may then be passed through (their writes no longer reach the daemon).
    pub const AMPLE_EXTRA: u64 = 1 << 30;

    /// The reserve of a store of `space`'s size.
    pub fn for_store(space: &StoreSpace) -> Reserve {
        let inodes = if space.total_inodes == 0 {
            0
        } else {
            (space.total_inodes / 32).clamp(64, 65_536)
        };
        Reserve {
            bytes: (space.total_bytes / 32).clamp(4 << 20, 1 << 30),
            inodes,
        }
    }

    /// May a smith add about `bytes` and `inodes` to a store with `space` free? A change that
    /// adds nothing always may.
    ///
    /// # Errors
    /// The bound it would pass.
    pub fn admit(&self, space: &StoreSpace, bytes: u64, inodes: u64) -> Result<(), BelowReserve> {
        if inodes > 0 && self.inodes > 0 && space.free_inodes < self.inodes.saturating_add(inodes) {
            return Err(BelowReserve {
                free: space.free_inodes,
                reserve: self.inodes,
                inodes: true,
            });
        }
        if bytes > 0 && space.free_bytes < self.bytes.saturating_add(bytes) {
            return Err(BelowReserve {
                free: space.free_bytes,
                reserve: self.bytes,
                inodes: false,
            });
        }
        Ok(())
    }

    /// Is free space ample (see [`Reserve::AMPLE_EXTRA`]; inodes: four reserves)?
    pub fn ample(&self, space: &StoreSpace) -> bool {
        space.free_bytes
            >= self
                .bytes
                .saturating_mul(4)
                .saturating_add(Self::AMPLE_EXTRA)
            && (self.inodes == 0 || space.free_inodes >= self.inodes.saturating_mul(4))
    }
}

/// A run's output stops a `1/OUTPUT_HEADROOM` short of its smith's byte quota
/// ([`Storage::admit_output`]).
pub const OUTPUT_HEADROOM: u64 = 16;

/// How long a `statvfs` of the store may stand for its free space ([`Storage::admit_reserve`]).
pub const SPACE_STALE: std::time::Duration = std::time::Duration::from_secs(1);

/// The store's free space as last read, and what the daemon admitted since.
#[derive(Clone, Copy, Debug)]
struct Cached {
    space: StoreSpace,
    at: std::time::Instant,
    /// Bytes admitted by [`Storage::admit_reserve`] since `at` (subtracted from the figure).
    since: u64,
}

/// The storage limits of a mount as one shared value: the quota in force (the live limits, so
/// `reload` changes it), the books (kept from the moment a quota is first configured), the
/// reserve, and a cached figure of the store's free space (docs/PROTOCOL-NOTES.md L12, L16,
/// L21). The filesystem checks smiths' changes with it; the scheduler's output pump checks the
/// runs' logs with it. Its locks are leaves, never held across a syscall.
#[derive(Debug)]
pub struct Storage {
    /// The books: built by one scan of the store when a quota is first in force (at mount or by
    /// a reload) and kept from then on, also if the quota is turned off again.
    ledger: std::sync::OnceLock<Ledger>,
    /// The limits in force; the quota is read from it at every admission.
    live: std::sync::Arc<super::live::LiveLimits>,
    /// The part of the store kept for the daemon's own writes.
    pub reserve: Reserve,
    /// The store's root (`O_PATH`), for `statvfs`.
    root: std::os::fd::OwnedFd,
    cached: Mutex<Option<Cached>>,
}

impl Storage {
    /// The limits of the store whose root is `root` (a descriptor of its own is kept), the
    /// quota read from `live` at each use, no books yet ([`Storage::ledger_or_build`] makes
    /// them). The reserve is computed from the store's size now.
    ///
    /// # Errors
    /// When `root` cannot be duplicated.
    pub fn new(
        root: BorrowedFd<'_>,
        live: std::sync::Arc<super::live::LiveLimits>,
    ) -> SysResult<Storage> {
        let root = backing::dup(root)?;
        let space = backing::statfs(root.as_fd())
            .map(|st| StoreSpace::from_statvfs(&st))
            .unwrap_or_default();
        Ok(Storage {
            ledger: std::sync::OnceLock::new(),
            live,
            reserve: Reserve::for_store(&space),
            root,
            cached: Mutex::new(None),
        })
    }

    /// The quota in force (docs/SPEC.md §8; `reload` changes it, §6).
    pub fn quota(&self) -> Quota {
        self.live.quota()
    }

    /// The books, if they were built.
    pub fn ledger(&self) -> Option<&Ledger> {
        self.ledger.get()
    }

    /// The books, built now by `build` (one scan of the store) if a quota is in force and they
    /// were never built; `None` while no quota was ever in force. Callers that meet an unbuilt
    /// ledger wait until the scan is over, so every change made during the scan is recorded
    /// after it (records are absolute: `st_blocks` as it is), and the books equal a scan
    /// afterwards (docs/PROTOCOL-NOTES.md L21).
    pub fn ledger_or_build(&self, build: impl FnOnce() -> Books) -> Option<&Ledger> {
        if let Some(l) = self.ledger.get() {
            return Some(l);
        }
        if !self.quota().is_set() {
            return None;
        }
        Some(self.ledger.get_or_init(|| Ledger::new(build())))
    }

    /// The store's free space now: one `statvfs`, which also refreshes the cached figure.
    pub fn space_now(&self) -> Option<StoreSpace> {
        let space = backing::statfs(self.root.as_fd())
            .ok()
            .map(|st| StoreSpace::from_statvfs(&st))?;
        *self.cached.lock() = Some(Cached {
            space,
            at: std::time::Instant::now(),
            since: 0,
        });
        Some(space)
    }

    /// The cached figure, less what was admitted since, when it is younger than
    /// [`SPACE_STALE`] and less than one reserve was admitted since; else `None`.
    fn space_cached(&self) -> Option<StoreSpace> {
        let c = (*self.cached.lock())?;
        if c.at.elapsed() >= SPACE_STALE || c.since >= self.reserve.bytes {
            return None;
        }
        Some(StoreSpace {
            free_bytes: c.space.free_bytes.saturating_sub(c.since),
            ..c.space
        })
    }

    /// May a smith's change (or a run's output) add about `bytes` and `inodes` to the store
    /// without leaving it below the reserve (docs/SPEC.md §8)? The cached figure answers when it
    /// is fresh and says there is room for the change and one more reserve (the margin that
    /// covers writes the daemon does not see within [`SPACE_STALE`]: passthrough writers, the
    /// operator, other processes of the host); otherwise, near the bound, one `statvfs`
    /// decides. A change that adds nothing always may. With no figure at all (the store cannot
    /// be stat'ed) it is admitted.
    ///
    /// # Errors
    /// The bound it would pass, judged on a fresh `statvfs`.
    pub fn admit_reserve(&self, bytes: u64, inodes: u64) -> Result<(), BelowReserve> {
        if bytes == 0 && inodes == 0 {
            return Ok(());
        }
        let margin = Reserve {
            bytes: self.reserve.bytes.saturating_mul(2),
            inodes: self.reserve.inodes.saturating_mul(2),
        };
        if let Some(space) = self.space_cached() {
            if margin.admit(&space, bytes, inodes).is_ok() {
                if let Some(c) = self.cached.lock().as_mut() {
                    c.since = c.since.saturating_add(bytes);
                }
                return Ok(());
            }
        }
        match self.space_now() {
            Some(space) => self.reserve.admit(&space, bytes, inodes),
            None => Ok(()),
        }
    }

    /// Is the store's free space ample ([`Reserve::ample`]), judged on the cached figure when
    /// fresh?
    pub fn ample(&self) -> bool {
        self.space_cached()
            .or_else(|| self.space_now())
            .is_some_and(|space| self.reserve.ample(&space))
    }

    /// May `payer` add about `bytes` and `inodes` under the mount's quota? Always, without a
    /// quota.
    ///
    /// # Errors
    /// The limit it would pass.
    pub fn admit_quota(
        &self,
        payer: SmithIdx,
        bytes: u64,
        inodes: u64,
    ) -> Result<(), StorageBound> {
        match self.ledger.get() {
            Some(l) => {
                let quota = self.quota();
                l.with(|b| b.admit(payer, bytes, inodes, quota))
            }
            None => Ok(()),
        }
    }

    /// May a run's output add about `bytes` to `payer`'s holdings? Against its byte quota less
    /// a sixteenth ([`OUTPUT_HEADROOM`]): a run printing without end leaves its smith room to
    /// publish its result (docs/PROTOCOL-NOTES.md L17). Always, without a byte quota.
    ///
    /// # Errors
    /// The (reduced) limit it would pass.
    pub fn admit_output(&self, payer: SmithIdx, bytes: u64) -> Result<(), StorageBound> {
        let Some(l) = self.ledger.get() else {
            return Ok(());
        };
        let quota = Quota {
            max_bytes: self
                .quota()
                .max_bytes
                .map(|b| b.saturating_sub(b / OUTPUT_HEADROOM)),
            max_inodes: None,
        };
        l.with(|b| b.admit(payer, bytes, 0, quota))
    }

    /// Is a byte quota in force (a limited smith's writes must reach the daemon)?
    pub fn limits_bytes(&self) -> bool {
        self.quota().max_bytes.is_some()
    }

    /// The entry `name` in `dir` lives at `home` (`None`: it costs nobody): charge it as it is
    /// now, and drop the charge of `replaced` (the inode the name held before, if another).
    /// Nothing without a quota. For the daemon's own writes into charged places (a run's
    /// directory, `meta.json`).
    pub fn charge_entry(
        &self,
        dir: BorrowedFd<'_>,
        name: &std::ffi::CStr,
        home: Option<Home>,
        replaced: Option<BackingIno>,
    ) {
        let Some(ledger) = self.ledger.get() else {
            return;
        };
        let Ok(st) = backing::stat_at(dir, name) else {
            return;
        };
        let ino = BackingIno::of(&st);
        ledger.with(|b| {
            if let Some(old) = replaced.filter(|o| *o != ino) {
                b.unlinked(old, 0, false);
            }
            b.record(ino, home, st.st_blocks as u64);
        });
    }

    /// The held inode `fd` lives at `home`: charge it as it is now (after the daemon wrote
    /// it). Nothing without a quota. Returns its `stat`, when read.
    pub fn charge_fd(&self, fd: BorrowedFd<'_>, home: Option<Home>) -> Option<libc::stat> {
        let ledger = self.ledger.get()?;
        let st = backing::stat(fd).ok()?;
        ledger.with(|b| b.record(BackingIno::of(&st), home, st.st_blocks as u64));
        Some(st)
    }
}

/// The zone of a registered smith dir, given its backing inode number (the registry's
/// `smith_at`).
pub type SmithAt<'a> = dyn Fn(BackingIno) -> Option<Zone> + 'a;

/// Rebuild the books from the store: one walk of the directory `dir` of zone `zone` (a smith
/// dir, or an area of one), `smith_at` telling the registered smith dirs below it, each
/// entry's charge taken from [`payer`] of its zone and one `fstatat`. Directories are read with
/// `openat2` beneath `dir`, never following a symlink. Entries that vanish while walked are
/// skipped.
///
/// # Errors
/// Only when `dir` itself cannot be read.
pub fn scan(
    dir: BorrowedFd<'_>,
    zone: Zone,
    smith_at: &SmithAt<'_>,
    root: Option<SmithIdx>,
) -> SysResult<Books> {
    let mut books = Books::new();
    let walker = Walker { smith_at, root };
    walker.walk(dir, zone, &mut books, 0)?;
    Ok(books)
}

/// Deepest directory level [`scan`] descends to (each level holds one descriptor).
const MAX_DEPTH: u32 = 512;

/// What [`scan`] needs at every level: the registered smith dirs, and the root smith (who pays
/// for `results/**`, [`payer_in`]).
struct Walker<'a, 'b> {
    smith_at: &'a SmithAt<'b>,
    root: Option<SmithIdx>,
}

impl Walker<'_, '_> {
    fn walk(
        &self,
        dir: BorrowedFd<'_>,
        zone: Zone,
        books: &mut Books,
        depth: u32,
    ) -> SysResult<()> {
        let mut stream = backing::DirStream::open(dir)?;
        let mut subdirs: Vec<(CString, Zone)> = Vec::new();
        while let Some(ent) = stream.next_entry()? {
            if ent.name == b"." || ent.name == b".." {
                continue;
            }
            let Ok(name) = CString::new(ent.name) else {
                continue;
            };
            let Ok(st) = backing::stat_at(dir, &name) else {
                continue;
            };
            let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
            let ino = BackingIno::of(&st);
            let child = match is_dir.then(|| (self.smith_at)(ino)).flatten() {
                Some(z) => z,
                None => zone.child_zone(std::ffi::OsStr::from_bytes(name.as_bytes())),
            };
            // A second name of a charged inode changes nothing (hard links).
            if !books.is_charged(ino) {
                let home = payer_in(&child, Some(name.as_bytes()), self.root);
                books.record(ino, home, st.st_blocks as u64);
            }
            if is_dir && !backing::is_daemon_temp(name.as_bytes()) {
                subdirs.push((name, child));
            }
        }
        drop(stream);
        if depth >= MAX_DEPTH {
            return Ok(());
        }
        for (name, child) in subdirs {
            let Ok(fd) = backing::open_beneath(dir, &name, libc::O_PATH | libc::O_DIRECTORY, 0)
            else {
                continue;
            };
            // A directory that cannot be read is skipped, not fatal.
            let _ = self.walk(fd.as_fd(), child, books, depth + 1);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use super::*;

    const X: SmithIdx = SmithIdx(1);
    const P: SmithIdx = SmithIdx(0);

    fn child_dir() -> Zone {
        Zone::smith_dir(X, Some(P), 1)
    }

    fn at(path: &[&str]) -> Zone {
        path.iter()
            .fold(child_dir(), |z, n| z.child_zone(OsStr::new(n)))
    }

    #[test]
    fn payer_follows_the_zone() {
        type Row = (&'static [&'static str], Option<(SmithIdx, Area)>);
        let table: &[Row] = &[
            (&[], None),
            (&["private"], None),
            (&["private", "a"], Some((X, Area::Private))),
            (&["private", "d", "e"], Some((X, Area::Private))),
            (&["outbox"], None),
            (&["outbox", "result.md"], Some((X, Area::Outbox))),
            (&["workspace"], None),
            (&["workspace", ".git"], Some((X, Area::Workspace))),
            (&["CLAUDE.md"], Some((X, Area::Other))),
            (&[".git", "HEAD"], Some((X, Area::Other))),
            (&["inbox"], None),
            (&["inbox", "task-1.md"], Some((P, Area::Inbox))),
            (&["config.json"], Some((P, Area::Config))),
            (&[".claude"], None),
            (&[".claude", "skills", "s.md"], Some((P, Area::Claude))),
            (&["smith.md"], None),
            (&["conversations"], None),
            (
                &["conversations", "run-0001"],
                Some((X, Area::Conversations)),
            ),
            (
                &["conversations", "run-0001", "messages.log"],
                Some((X, Area::Conversations)),
            ),
            (&["children"], None),
            (&["children", "stray"], None),
        ];
        for (path, want) in table {
            let got = payer(&at(path)).map(|h| (h.payer, h.area));
            assert_eq!(got, *want, "{path:?}");
            if let Some(h) = payer(&at(path)) {
                assert_eq!(h.smith, X, "{path:?}");
            }
        }
        // The root smith's inbox and config cost nobody (the operator writes them).
        let root = Zone::smith_dir(P, None, 0);
        assert_eq!(payer(&root.child_zone(OsStr::new("config.json"))), None);
        let inbox = root.child_zone(OsStr::new("inbox"));
        assert_eq!(payer(&inbox.child_zone(OsStr::new("task-1.md"))), None);
        // Nothing outside smiths/ is charged by zone alone.
        let results = Zone::root().child_zone(OsStr::new("results"));
        assert_eq!(payer(&results.child_zone(OsStr::new("final.md"))), None);
    }

    #[test]
    fn the_root_pays_for_results_but_final_md() {
        let results = Zone::root().child_zone(OsStr::new("results"));
        let inner = results.child_zone(OsStr::new("notes.md"));
        // (zone, name, root smith, who pays)
        type Row<'a> = (
            &'a Zone,
            Option<&'a [u8]>,
            Option<SmithIdx>,
            Option<SmithIdx>,
        );
        let table: &[Row<'_>] = &[
            (&inner, Some(b"notes.md"), Some(P), Some(P)),
            (&inner, None, Some(P), Some(P)),
            (&inner, Some(b"final.md"), Some(P), None),
            (&inner, Some(b"notes.md"), None, None),
            // results/ itself is structure of the mount: nobody's.
            (&results, Some(b"results"), Some(P), None),
            (
                &Zone::root().child_zone(OsStr::new("agents")),
                Some(b"a.sh"),
                Some(P),
                None,
            ),
        ];
        for (zone, name, root, want) in table {
            let got = payer_in(zone, *name, *root).map(|h| h.payer);
            assert_eq!(got, *want, "{zone:?} {name:?}");
        }
        // In a smith dir the name changes nothing.
        let private = at(&["private", "final.md"]);
        assert_eq!(
            payer_in(&private, Some(b"final.md"), Some(P)),
            payer(&private)
        );
    }

    fn home(area: Area) -> Option<Home> {
        payer(&at(&[
            match area {
                Area::Private => "private",
                Area::Outbox => "outbox",
                _ => "inbox",
            },
            "f",
        ]))
    }

    #[test]
    fn books_follow_blocks_links_and_unlinks() {
        let mut b = Books::new();
        // (step, expected X bytes, expected X inodes)
        assert_eq!(b.record(BackingIno(10), home(Area::Private), 8), 4096);
        assert_eq!(
            b.usage(X),
            Usage {
                bytes: 4096,
                inodes: 1
            }
        );
        // Growth and shrink apply the difference.
        assert_eq!(b.resize(BackingIno(10), 24), 8192);
        assert_eq!(b.resize(BackingIno(10), 0), -12288);
        assert_eq!(
            b.usage(X),
            Usage {
                bytes: 0,
                inodes: 1
            }
        );
        // A rename within X's areas moves nothing.
        b.record(BackingIno(10), home(Area::Outbox), 8);
        assert_eq!(
            b.usage(X),
            Usage {
                bytes: 4096,
                inodes: 1
            }
        );
        // Into the inbox of X: the file now costs X's parent.
        b.record(BackingIno(10), home(Area::Inbox), 8);
        assert_eq!(b.usage(X), Usage::default());
        assert_eq!(
            b.usage(P),
            Usage {
                bytes: 4096,
                inodes: 1
            }
        );
        // Unknown inodes are not resized.
        assert_eq!(b.resize(BackingIno(99), 8), 0);
        // An unlink with names left changes nothing; the last one of an open file waits for
        // the forget; of a closed one, goes at once.
        b.record(BackingIno(11), home(Area::Private), 16);
        b.unlinked(BackingIno(11), 1, false);
        assert_eq!(b.usage(X).inodes, 1);
        b.unlinked(BackingIno(11), 0, true);
        assert_eq!(
            b.usage(X),
            Usage {
                bytes: 8192,
                inodes: 1
            }
        );
        // An orphan still grows with writes through its open handle.
        b.resize(BackingIno(11), 24);
        assert_eq!(b.usage(X).bytes, 12288);
        b.forgotten(BackingIno(10)); // not an orphan: kept
        assert!(b.is_charged(BackingIno(10)));
        b.forgotten(BackingIno(11));
        assert_eq!(b.usage(X), Usage::default());
        b.unlinked(BackingIno(10), 0, false);
        assert_eq!(b.totals(), vec![]);
        // Out of every charged zone: the charge goes.
        b.record(BackingIno(12), home(Area::Private), 8);
        assert_eq!(b.record(BackingIno(12), None, 8), -4096);
        assert_eq!(b.totals(), vec![]);
    }

    #[test]
    fn admission_by_quota() {
        let mut b = Books::new();
        b.record(BackingIno(1), home(Area::Private), 2 * 1024 * 2); // 2 MiB
        let q = Quota {
            max_bytes: Some(3 << 20),
            max_inodes: Some(2),
        };
        let cases: &[(u64, u64, Result<(), &str>)] = &[
            (0, 0, Ok(())),
            (1 << 20, 0, Ok(())),
            ((1 << 20) + 1, 0, Err("bytes")),
            (0, 1, Ok(())),
            (0, 2, Err("inodes")),
            (u64::MAX, 0, Err("bytes")),
        ];
        for (bytes, inodes, want) in cases {
            let got = b.admit(X, *bytes, *inodes, q).map_err(|e| match e {
                StorageBound::Bytes { .. } => "bytes",
                StorageBound::Inodes { .. } => "inodes",
                StorageBound::Reserve { .. } => "reserve",
            });
            assert_eq!(got, *want, "{bytes} {inodes}");
        }
        // At the limit a change that adds nothing passes.
        b.record(BackingIno(2), home(Area::Private), 2048);
        assert!(b.admit(X, 0, 0, q).is_ok());
        assert!(b.admit(X, 1, 0, q).is_err());
        assert!(b.admit(X, 0, 1, q).is_err());
        assert!(b.admit(X, 1 << 40, 1 << 20, Quota::default()).is_ok());
    }

    #[test]
    fn reserve_of_a_store_and_admission() {
        let mib = 1u64 << 20;
        let space = |total: u64, free: u64| StoreSpace {
            total_bytes: total,
            free_bytes: free,
            total_inodes: 16_384,
            free_inodes: 10_000,
        };
        // (store size, reserve)
        for (total, want) in [
            (64 * mib, 4 * mib),
            (1024 * mib, 32 * mib),
            (1 << 40, 1 << 30),
        ] {
            assert_eq!(Reserve::for_store(&space(total, 0)).bytes, want, "{total}");
        }
        let r = Reserve::for_store(&space(64 * mib, 0));
        assert_eq!(r.inodes, 512);
        // (free, bytes asked, inodes asked, admitted)
        let cases = [
            (10 * mib, mib, 0, true),
            (10 * mib, 6 * mib, 0, true),
            (10 * mib, 6 * mib + 1, 0, false),
            (4 * mib, 0, 0, true),
            (4 * mib, 1, 0, false),
            (3 * mib, 0, 1, true),
        ];
        for (free, bytes, inodes, ok) in cases {
            assert_eq!(
                r.admit(&space(64 * mib, free), bytes, inodes).is_ok(),
                ok,
                "{free} {bytes} {inodes}"
            );
        }
        let few = StoreSpace {
            free_inodes: 512,
            ..space(64 * mib, 60 * mib)
        };
        assert_eq!(
            r.admit(&few, 0, 1),
            Err(BelowReserve {
                free: 512,
                reserve: 512,
                inodes: true
            })
        );
        // A small store is never ample; a large one while it has 4 reserves + 1 GiB free.
        assert!(!r.ample(&space(64 * mib, 64 * mib)));
        let big = |free: u64| StoreSpace {
            total_bytes: 1 << 40,
            free_bytes: free,
            total_inodes: 1 << 24,
            free_inodes: 1 << 23,
        };
        let rb = Reserve::for_store(&big(0));
        assert!(rb.ample(&big(5 << 30)));
        assert!(!rb.ample(&big((5 << 30) - 1)));
        // No inode count (some filesystems): no inode reserve.
        let none = StoreSpace {
            total_inodes: 0,
            free_inodes: 0,
            ..space(64 * mib, 60 * mib)
        };
        assert_eq!(Reserve::for_store(&none).inodes, 0);
        assert!(Reserve::for_store(&none).admit(&none, 0, 1).is_ok());
    }

    #[test]
    fn replace_area_drops_what_is_gone() {
        let mut b = Books::new();
        b.record(BackingIno(1), home(Area::Private), 8);
        b.record(BackingIno(2), home(Area::Outbox), 8);
        b.record(BackingIno(3), home(Area::Outbox), 8);
        b.unlinked(BackingIno(3), 0, true);
        let mut found = Books::new();
        found.record(BackingIno(4), home(Area::Outbox), 16);
        b.replace_area(X, Area::Outbox, &found);
        assert!(
            b.is_charged(BackingIno(1))
                && !b.is_charged(BackingIno(2))
                && b.is_charged(BackingIno(3))
                && b.is_charged(BackingIno(4))
        );
        assert_eq!(
            b.usage(X),
            Usage {
                bytes: 4096 * 4,
                inodes: 3
            }
        );
    }

    #[test]
    fn scan_counts_each_inode_once_and_sparse_by_data() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let d = tmp.path();
        for sub in [
            "private/deep",
            "outbox",
            "inbox",
            "children/smith-002/private",
        ] {
            std::fs::create_dir_all(d.join(sub)).expect("mkdir");
        }
        std::fs::write(d.join("private/a"), vec![1u8; 10_000]).expect("write");
        std::fs::hard_link(d.join("private/a"), d.join("private/deep/a2")).expect("link");
        let sparse = std::fs::File::create(d.join("outbox/sparse")).expect("create");
        sparse.set_len(1 << 30).expect("truncate");
        std::fs::write(d.join("inbox/task-1.md"), b"do it").expect("write");
        std::fs::write(d.join("CLAUDE.md"), b"x").expect("write");
        std::fs::write(d.join("children/smith-002/private/n"), b"child").expect("write");
        let root = backing::open_store_root(d).expect("open");
        let child_ino = {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(d.join("children/smith-002"))
                .expect("stat")
                .ino()
        };
        let grandchild = SmithIdx(2);
        let smith_at = move |ino: BackingIno| {
            (ino == BackingIno(child_ino)).then(|| Zone::smith_dir(grandchild, Some(X), 2))
        };
        let books = scan(root.as_fd(), child_dir(), &smith_at, None).expect("scan");
        let blocks = |p: &str| {
            use std::os::unix::fs::MetadataExt;
            std::fs::symlink_metadata(d.join(p)).expect("stat").blocks() * BLOCK
        };
        // X: private/a (once), private/deep (dir), outbox/sparse (no data), CLAUDE.md.
        let want_x = Usage {
            bytes: blocks("private/a")
                + blocks("private/deep")
                + blocks("outbox/sparse")
                + blocks("CLAUDE.md"),
            inodes: 4,
        };
        assert_eq!(books.usage(X), want_x);
        assert!(
            blocks("outbox/sparse") < 1 << 20,
            "a sparse file costs its data"
        );
        // The parent pays for the task; the grandchild for its private file.
        assert_eq!(books.usage(P).inodes, 1);
        assert_eq!(books.usage(grandchild).inodes, 1);
        // A second scan gives the same books.
        assert_eq!(
            scan(root.as_fd(), child_dir(), &smith_at, None).expect("scan"),
            books
        );
    }
}
