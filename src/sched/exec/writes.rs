//! The daemon's own writes into the store (run directories, `messages.log`, `meta.json`,
//! `results/final.md`). Each is three steps — the change, its charge on the quota books
//! (docs/SPEC.md §8: the daemon's writes are charged, never refused), and the kernel told that
//! its cache is stale (docs/PROTOCOL-NOTES.md U13) — made by one call here, so no caller can
//! forget one.

use std::ffi::{CStr, OsStr};
use std::os::fd::{AsFd, BorrowedFd};
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
    /// Move `<rel>/outbox/result.md` (smith `s`'s, from the store's root `root`) to `name` in
    /// its run directory `run_dir` (backing inode `run_dir_ino`): charged there as the run's
    /// ([`run_home`]), both names told to the kernel. For a `lost` run's half-written result
    /// (docs/PROTOCOL-NOTES.md R43). Errors: the open or the rename's errno (nothing moved).
    pub(super) fn set_aside_result(
        &self,
        root: BorrowedFd<'_>,
        rel: &str,
        s: SmithIdx,
        run_dir: BorrowedFd<'_>,
        run_dir_ino: BackingIno,
        name: &CStr,
    ) -> SysResult<()> {
        let outbox = backing::open_dir_path(root, &std::path::Path::new(rel).join("outbox"))?;
        let outbox_ino = BackingIno::of(&backing::stat(outbox.as_fd())?);
        backing::rename(outbox.as_fd(), c"result.md", run_dir, name, 0)?;
        self.storage
            .charge_entry(run_dir, name, Some(run_home(s)), None);
        self.invalidate.entry(outbox_ino, OsStr::new("result.md"));
        self.invalidate
            .entry(run_dir_ino, OsStr::from_bytes(name.to_bytes()));
        Ok(())
    }

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

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;
    use std::path::Path;

    use parking_lot::Mutex;

    use super::*;
    use crate::limits::live::{LiveLimits, Snapshot};
    use crate::limits::storage::Books;

    /// The kernel's side: what it was told.
    #[derive(Default)]
    struct Told(Mutex<Vec<String>>);

    impl Invalidate for Told {
        fn entry(&self, parent: BackingIno, name: &OsStr) {
            self.0
                .lock()
                .push(format!("entry {} {}", parent.0, name.to_string_lossy()));
        }
        fn inode(&self, ino: BackingIno) {
            self.0.lock().push(format!("inode {}", ino.0));
        }
    }

    /// Every kind of daemon write charges what it made to the smith and tells the kernel, in
    /// the one call: a replaced `meta.json` is one inode on the books (the old one dropped), an
    /// appended log is charged, a bare announcement only announces.
    #[test]
    fn each_write_is_charged_and_announced() {
        let tmp = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(tmp.path().join("run")).expect("mkdir");
        let root = backing::open_store_root(tmp.path()).expect("root");
        let limits = crate::config::Limits {
            max_inodes_per_smith: Some(100),
            ..crate::config::Limits::default()
        };
        let live = Arc::new(LiveLimits::new(Snapshot::new(limits, 16)));
        let storage = Arc::new(Storage::new(root.as_fd(), live).expect("storage"));
        let ledger = storage
            .ledger_or_build(Books::new)
            .expect("a quota keeps books");
        let told = Arc::new(Told::default());
        let writes = Writes::new(storage.clone(), told.clone());
        let s = SmithIdx(1);
        let dir = backing::open_dir_path(root.as_fd(), Path::new("run")).expect("run dir");
        let dir_ino = BackingIno::of(&backing::stat(dir.as_fd()).expect("stat"));

        writes.meta(s, dir.as_fd(), dir_ino, &Meta::default());
        writes.meta(s, dir.as_fd(), dir_ino, &Meta::default());
        assert_eq!(
            ledger.usage(s).inodes,
            1,
            "the replaced meta.json is dropped"
        );

        let log = backing::open_file(
            dir.as_fd(),
            c"messages.log",
            libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
            0o644,
        )
        .expect("log");
        let log_ino = BackingIno::of(&backing::stat(log.as_fd()).expect("stat"));
        (writes.append(log.as_fd(), log_ino, b"smithfs: x\n", Some(run_home(s)))).expect("append");
        assert_eq!(ledger.usage(s).inodes, 2);

        writes.made(dir_ino, OsStr::new("conversations"), &[], None);
        assert_eq!(ledger.usage(s).inodes, 2, "an announcement charges nothing");

        let d = dir_ino.0;
        assert_eq!(
            *told.0.lock(),
            [
                format!("entry {d} meta.json"),
                format!("entry {d} meta.json"),
                format!("inode {}", log_ino.0),
                format!("entry {d} conversations"),
            ]
        );
    }
}
