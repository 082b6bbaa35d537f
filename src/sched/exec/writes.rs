//! The daemon's own writes into the store (run directories, `messages.log`, `meta.json`,
//! `results/final.md`). Each is three steps — the change, its charge on the quota books
//! (docs/SPEC.md §8: the daemon's writes are charged, never refused), and the kernel told that
//! its cache is stale (docs/PROTOCOL-NOTES.md U13) — made by one call here, so no caller can
//! forget one.

use std::ffi::{CStr, OsStr};
use std::os::fd::BorrowedFd;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use crate::backing::{self, BackingIno, SysResult};
use crate::limits::storage::{Home, Storage};
use crate::policy::zone::Area;
use crate::sched::runner::Meta;
use crate::sched::Invalidate;
use crate::tree::model::SmithIdx;

/// The storage books and the kernel's caches, for the daemon's own writes.
pub(super) struct Writes {
    storage: Arc<Storage>,
    invalidate: Arc<dyn Invalidate>,
}

impl Writes {
    pub(super) fn new(storage: Arc<Storage>, invalidate: Arc<dyn Invalidate>) -> Writes {
        Writes {
            storage,
            invalidate,
        }
    }

    /// The daemon made `name` in the directory of backing inode `parent` (already in the
    /// store): charge the new inodes `made` (held) to `home`, then announce the name. With no
    /// `made` (a directory the books do not count, a copy outside every smith) only announce.
    pub(super) fn made(
        &self,
        parent: BackingIno,
        name: &OsStr,
        made: &[BorrowedFd<'_>],
        home: Option<Home>,
    ) {
        for fd in made {
            self.storage.charge_fd(*fd, home);
        }
        self.invalidate.entry(parent, name);
    }

    /// Append `bytes` to the held file `file` (backing inode `ino`), charge its new size to
    /// `home`, drop the kernel's cached attributes. Errors: the write's errno (nothing charged
    /// or told).
    pub(super) fn append(
        &self,
        file: BorrowedFd<'_>,
        ino: BackingIno,
        bytes: &[u8],
        home: Option<Home>,
    ) -> SysResult<()> {
        backing::write(file, bytes)?;
        self.storage.charge_fd(file, home);
        self.invalidate.inode(ino);
        Ok(())
    }

    /// Replace `name` in the held directory `dir` (backing inode `dir_ino`) with `bytes`,
    /// atomically (a new inode; [`backing::write_replace`]): the books charge the new inode to
    /// `home` and drop the one it replaced; the kernel forgets the old name. Errors: the
    /// write's errno (nothing charged or told).
    pub(super) fn replace(
        &self,
        dir: BorrowedFd<'_>,
        dir_ino: BackingIno,
        name: &CStr,
        bytes: &[u8],
        home: Option<Home>,
    ) -> SysResult<()> {
        let old = backing::stat_at(dir, name)
            .ok()
            .map(|st| BackingIno::of(&st));
        backing::write_replace(dir, name, bytes, 0o644)?;
        self.storage.charge_entry(dir, name, home, old);
        self.invalidate
            .entry(dir_ino, OsStr::from_bytes(name.to_bytes()));
        Ok(())
    }

    /// The inode `ino` changed behind the kernel by a write made elsewhere (the output pump's
    /// into a log): drop the kernel's cached attributes.
    pub(super) fn changed(&self, ino: BackingIno) {
        self.invalidate.inode(ino);
    }
}

impl Writes {
    /// Write `meta.json` of smith `s`'s run directory `dir` (backing inode `dir_ino`), charged
    /// to the smith ([`run_home`]). A failed write is logged and otherwise ignored: the journal
    /// says the same.
    pub(super) fn meta(&self, s: SmithIdx, dir: BorrowedFd<'_>, dir_ino: BackingIno, meta: &Meta) {
        if let Err(e) = self.replace(
            dir,
            dir_ino,
            c"meta.json",
            &meta.to_json(),
            Some(run_home(s)),
        ) {
            tracing::warn!(run = %meta.run_id, "cannot write meta.json: {e}");
        }
    }
}

/// Where a run's directory, `meta.json` and `messages.log` are charged: to its smith
/// (`storage::payer` of `conversations/**`).
pub(super) fn run_home(s: SmithIdx) -> Home {
    Home {
        payer: s,
        smith: s,
        area: Area::Conversations,
    }
}
