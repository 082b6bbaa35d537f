//! Storage quotas and the store's reserve, as the filesystem enforces them (docs/SPEC.md §8;
//! the model is `crate::limits::storage`, docs/PROTOCOL-NOTES.md L9–L14).
//!
//! Every change a smith makes through the daemon that may allocate is first *admitted*
//! ([`SmithFs::admit_storage`]: the store's reserve, then the payer's quota, on an estimate of
//! what it adds), then *settled*: the backing inode is stat'ed again and the books take the
//! difference of `st_blocks` ([`SmithFs::settle_fd`], [`SmithFs::settle_new`]). The books are
//! kept only when a quota is configured; the reserve is checked whatever the limits, on a
//! cached figure of the store's free space while far from it (`Storage::admit_reserve`,
//! docs/PROTOCOL-NOTES.md L16). Without a quota, a write far from the reserve costs no syscall
//! here.

use std::os::fd::{AsFd, BorrowedFd};

use super::error::FsResult;
use super::inode::Inode;
use super::{backing, Caller, SmithFs};
use crate::backing::BackingIno;
use crate::identity::Identity;
use crate::limits::storage::{self, Books, Ledger, Usage};
use crate::policy::{storage_denial, Held, StorageBound, Zone};

/// Round `n` bytes up to whole 4 KiB blocks (the estimate of what a write allocates).
fn blocks_up(n: u64) -> u64 {
    n.saturating_add(4095) & !4095
}

impl SmithFs {
    /// The books: built by one scan of the store the first time they are needed while a quota
    /// is in force (at mount, or after a `reload` turned one on; docs/PROTOCOL-NOTES.md L21),
    /// `None` while no quota ever was. Requests that need them during that scan wait for it.
    pub(super) fn books(&self) -> Option<&Ledger> {
        self.storage.ledger_or_build(|| {
            let started = std::time::Instant::now();
            let books = self.storage_scan().unwrap_or_default();
            tracing::info!(
                smiths = books.totals().len(),
                ms = started.elapsed().as_millis() as u64,
                "storage counted"
            );
            books
        })
    }

    /// Admit a change by `who` to an entry of `zone` that adds about `bytes` and `inodes`
    /// (docs/SPEC.md §8): the operator, unknown callers and changes that add nothing always
    /// pass; a smith's change fails with ENOSPC when it would leave the store below its reserve
    /// (`store-reserve`), with EDQUOT when the payer of `zone` would pass its quota
    /// (`storage-bytes-per-smith`, `storage-inodes-per-smith`). Each refusal is explained in
    /// `.smithfs/why` and journaled.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn admit_storage(
        &self,
        caller: &Caller,
        who: Identity,
        zone: &Zone,
        bytes: u64,
        inodes: u64,
        op: &str,
        path: impl FnOnce() -> String,
    ) -> FsResult<()> {
        let Identity::Smith(_) = who else {
            return Ok(());
        };
        if bytes == 0 && inodes == 0 {
            return Ok(());
        }
        let bound = self.storage_bound(zone, bytes, inodes);
        match bound {
            None => Ok(()),
            Some(b) => {
                let held = self.held_for(zone, b);
                let d = storage_denial(&self.identity_name(who), b, &held);
                Err(self.record_denial(caller, who, op, path(), d, true))
            }
        }
    }

    /// Where the payer of `zone` holds what `bound` counts (bytes or inodes), for the `why`;
    /// nothing for the store's reserve.
    fn held_for(&self, zone: &Zone, bound: StorageBound) -> Vec<(Held, u64)> {
        let (Some(home), Some(ledger)) = (self.payer_of(zone, None), self.books()) else {
            return Vec::new();
        };
        let pick = |u: Usage| match bound {
            StorageBound::Bytes { .. } => u.bytes,
            StorageBound::Inodes { .. } => u.inodes,
            StorageBound::Reserve { .. } => 0,
        };
        ledger
            .held(home.payer)
            .into_iter()
            .map(|(h, u)| (h, pick(u)))
            .collect()
    }

    /// The bound a change adding `bytes` and `inodes` in `zone` would pass, if any.
    fn storage_bound(&self, zone: &Zone, bytes: u64, inodes: u64) -> Option<StorageBound> {
        if let Err(r) = self.storage.admit_reserve(bytes, inodes) {
            return Some(StorageBound::Reserve {
                free: r.free,
                reserve: r.reserve,
                inodes: r.inodes,
            });
        }
        let home = self.payer_of(zone, None)?;
        // A quota a reload just turned on: its books are built before the first admission.
        let _ = self.books();
        self.storage.admit_quota(home.payer, bytes, inodes).err()
    }

    /// Admit a write of `len` bytes at `offset` (`append`: at the end) through the open file
    /// `fd` of `inode` by `who`: it is estimated to allocate what it writes beyond the end of
    /// the file, or all of it when the file has holes.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn admit_write(
        &self,
        caller: &Caller,
        who: Identity,
        inode: &Inode,
        fd: BorrowedFd<'_>,
        offset: u64,
        len: u64,
        append: bool,
        op: &str,
    ) -> FsResult<()> {
        let Identity::Smith(_) = who else {
            return Ok(());
        };
        // Without books, a write whose whole length fits above the reserve on the cached
        // figure needs no stat of the file (at most its length is new).
        if self.books().is_none() && self.storage.admit_reserve(blocks_up(len), 0).is_ok() {
            return Ok(());
        }
        let st = backing::stat(fd)?;
        let size = st.st_size as u64;
        let dense = (st.st_blocks as u64).saturating_mul(storage::BLOCK) >= size;
        let offset = if append { size } else { offset };
        let end = offset.saturating_add(len);
        // Into a file with holes a write may fill any of them; else only past the end allocates.
        let adds = if dense {
            end.saturating_sub(size.max(offset))
        } else {
            len
        };
        let zone = self.zone(inode);
        self.admit_storage(caller, who, &zone, blocks_up(adds), 0, op, || {
            self.path_of(inode)
        })
    }

    /// The books take the allocation of the held inode `fd` as it is now (after a write,
    /// truncate, fallocate or copy through it, or its release).
    pub(super) fn settle_fd(&self, fd: BorrowedFd<'_>) {
        let Some(ledger) = self.books() else {
            return;
        };
        if let Ok(st) = backing::stat(fd) {
            ledger.with(|b| b.resize(BackingIno::of(&st), st.st_blocks as u64));
        }
    }

    /// The books catch up with the files open for writing with passthrough (their writes
    /// never reach the daemon): one `fstat` each. Called about once a second by the daemon's
    /// upkeep, so a writer that joined a passthrough reader (docs/PROTOCOL-NOTES.md L13) shows in
    /// its payer's usage within a second, not only at its close, and the payer's other writes
    /// are refused as soon as the books show it over. Nothing without a quota.
    pub fn settle_passthrough_writers(&self) {
        if self.books().is_none() {
            return;
        }
        for h in self.files.all() {
            if h.may_write && h.passthrough.load(std::sync::atomic::Ordering::Relaxed) {
                self.settle_fd(h.fd.as_fd());
            }
        }
    }

    /// Who pays for the entry `name` (when known) of zone `zone`: `storage::payer_in` with this
    /// mount's root smith.
    fn payer_of(&self, zone: &Zone, name: Option<&[u8]>) -> Option<storage::Home> {
        storage::payer_in(zone, name, self.registry.root())
    }

    /// A new entry `name` (`st`, its fresh `stat`) was made in `dir` with zone `zone`: charge
    /// it, and the directory's growth.
    pub(super) fn settle_new(&self, dir: &Inode, name: &[u8], zone: &Zone, st: &libc::stat) {
        let Some(ledger) = self.books() else {
            return;
        };
        let home = self.payer_of(zone, Some(name));
        ledger.with(|b| b.record(BackingIno::of(st), home, st.st_blocks as u64));
        if let Ok(fd) = dir.fd() {
            self.settle_fd(fd.as_fd());
        }
    }

    /// The name of the entry whose `stat` before the removal was `st` is gone from `dir`
    /// (unlink, rmdir, or replaced by a rename). A file's space comes back when its last name
    /// is gone and the kernel has let go of it ([`SmithFs::storage_forgotten`]).
    pub(super) fn storage_unlinked(&self, dir: &Inode, st: &libc::stat) {
        let Some(ledger) = self.books() else {
            return;
        };
        let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
        let nlink = if is_dir {
            0
        } else {
            st.st_nlink.saturating_sub(1)
        };
        let held = !is_dir
            && self
                .inodes
                .find(self.inodes.ids.node_id(BackingIno::of(st)))
                .is_some();
        ledger.with(|b| b.unlinked(BackingIno::of(st), nlink, held));
        if let Ok(fd) = dir.fd() {
            self.settle_fd(fd.as_fd());
        }
    }

    /// The kernel let go of node `id` (backing inode `ino`): an unlinked file's space is free.
    pub(super) fn storage_forgotten(&self, ino: BackingIno) {
        if let Some(ledger) = self.books() {
            ledger.with(|b| b.forgotten(ino));
        }
    }

    /// The entry whose `stat` before the rename was `st` is now `name` in `dir`, of zone
    /// `zone`: a file is charged to its new payer; a directory whose payer or area changed
    /// carries its subtree over (one walk of it).
    pub(super) fn storage_moved(
        &self,
        st: &libc::stat,
        dir: &Inode,
        cname: &std::ffi::CStr,
        zone: &Zone,
    ) {
        let Some(ledger) = self.books() else {
            return;
        };
        let home = self.payer_of(zone, Some(cname.to_bytes()));
        let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
        let changed = ledger.with(|b| {
            let before = b.home(BackingIno::of(st));
            b.rehome(BackingIno::of(st), home);
            before != home
        });
        if is_dir && changed {
            self.charge_subtree(dir, cname, zone);
        }
    }

    /// Walk the directory `cname` in `dir` (of zone `zone`) and charge everything in it where
    /// it now is.
    pub(super) fn charge_subtree(&self, dir: &Inode, cname: &std::ffi::CStr, zone: &Zone) {
        let Some(ledger) = self.books() else {
            return;
        };
        let Ok(dfd) = dir.fd() else {
            return;
        };
        let Ok(sub) =
            backing::open_beneath(dfd.as_fd(), cname, libc::O_PATH | libc::O_DIRECTORY, 0)
        else {
            return;
        };
        let smith_at = |ino: BackingIno| {
            self.registry
                .smith_at(ino)
                .map(|(i, p, l)| Zone::smith_dir(i, p, l))
        };
        match storage::scan(sub.as_fd(), *zone, &smith_at, self.registry.root()) {
            Ok(found) => ledger.with(|b| b.absorb(&found)),
            Err(e) => tracing::warn!("cannot count a moved directory: {e}"),
        }
    }

    /// Rebuild the books from the store (after the operator moved a smith dir, whose smiths
    /// were registered anew). Nothing without a quota.
    pub(super) fn storage_recount(&self) {
        let Some(ledger) = self.books() else {
            return;
        };
        match self.storage_scan() {
            Some(books) => ledger.with(|b| b.replace_all(books)),
            None => tracing::warn!("cannot recount the store"),
        }
    }

    /// A fresh scan of the store (what the books should say), or `None` when there is no
    /// root smith or it cannot be read.
    pub fn storage_scan(&self) -> Option<Books> {
        let root_smith = self.registry.root()?;
        let info = self.registry.get(root_smith)?;
        let store = self.inodes.root();
        let fd = store.fd().ok()?;
        let dir = backing::open_dir_path(fd.as_fd(), std::path::Path::new(&info.rel_dir())).ok()?;
        let smith_at = |ino: BackingIno| {
            self.registry
                .smith_at(ino)
                .map(|(i, p, l)| Zone::smith_dir(i, p, l))
        };
        let root = Some(root_smith);
        let mut books = storage::scan(
            dir.as_fd(),
            Zone::smith_dir(root_smith, None, 0),
            &smith_at,
            root,
        )
        .ok()?;
        // results/**: the root smith's too (docs/PROTOCOL-NOTES.md L9).
        let results = Zone::root().child_zone(std::ffi::OsStr::new("results"));
        if let Ok(rd) = backing::open_dir_path(fd.as_fd(), std::path::Path::new("results")) {
            match storage::scan(rd.as_fd(), results, &smith_at, root) {
                Ok(found) => books.absorb(&found),
                Err(e) => tracing::warn!("cannot count results/: {e}"),
            }
        }
        Some(books)
    }

    /// What the books say `smith` holds; `None` when no quota is configured (nothing is
    /// counted).
    pub fn storage_usage(&self, smith: crate::tree::model::SmithIdx) -> Option<Usage> {
        self.books().map(|l| l.usage(smith))
    }

    /// The books as they are (for `ctl`-less checks in tests: compare with
    /// [`SmithFs::storage_scan`]).
    pub fn storage_books(&self) -> Option<Books> {
        self.books().map(|l| l.snapshot())
    }

    /// The `whoami` lines of `smith`'s storage (docs/SPEC.md §7, §8; docs/PROTOCOL-NOTES.md L13):
    /// what its zones hold and its limits, while a quota is in force; else nothing.
    pub(super) fn storage_lines(&self, smith: crate::tree::model::SmithIdx) -> String {
        if !self.storage.quota().is_set() {
            return String::new();
        }
        let Some(ledger) = self.books() else {
            return String::new();
        };
        let u = ledger.usage(smith);
        let quota = self.storage.quota();
        let limit = |l: Option<u64>| l.map_or_else(|| "none".to_owned(), |n| n.to_string());
        format!(
            "storage bytes: {}\nstorage inodes: {}\nstorage max bytes: {}\nstorage max inodes: {}\n",
            u.bytes,
            u.inodes,
            limit(quota.max_bytes),
            limit(quota.max_inodes)
        )
    }

    /// Must the writes of a file `who` opens for writing reach the daemon (no passthrough)?
    /// For a smith when a byte quota is set, or when the store's free space is not ample
    /// (its writes must be checked against the reserve).
    pub(super) fn checks_writes_of(&self, who: Identity) -> bool {
        let Identity::Smith(_) = who else {
            return false;
        };
        self.storage.limits_bytes() || !self.storage.ample()
    }
}
