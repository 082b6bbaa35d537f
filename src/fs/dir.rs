//! Directories: opendir, readdir(plus), releasedir, fsyncdir; statfs.

use std::ffi::{CString, OsStr};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;

use super::control::ControlFile;
use super::error::{FsError, FsResult};
use super::ids::{Fh, NodeId};
use super::open::OpenDir;
use super::{backing, control, Attr, Caller, DirEntryOut, SmithFs};
use crate::identity::Identity;
use crate::policy::Op;

impl SmithFs {
    /// Open the directory `ino` for reading (FUSE opendir).
    pub fn opendir(&self, caller: &Caller, ino: NodeId) -> FsResult<Fh> {
        let who = self.identify(caller);
        if ino == control::DIR_ID {
            if who == Identity::Unknown {
                return Err(FsError::ControlUnknown);
            }
            return Ok(Fh(0));
        }
        let inode = self.inodes.get(ino)?;
        self.check_inode(caller, who, Op::Read, "list", &inode)?;
        let slot = self.charge(caller, who, "list", || self.path_of(&inode))?;
        // The directory itself is opened at the first readdir (see `OpenDir`).
        Ok(self.dirs.insert(OpenDir::new(inode, who, slot)))
    }

    /// List the directory behind handle `fh` from cookie `offset`, feeding entries to `add`
    /// until it returns `true` (buffer full). With `plus`, each entry but `.`/`..` is looked up;
    /// an entry that does not fit is forgotten again. The root also lists `.smithfs`.
    pub fn readdir(
        &self,
        ino: NodeId,
        fh: Fh,
        offset: u64,
        plus: bool,
        mut add: impl FnMut(&DirEntryOut<'_>) -> bool,
    ) -> FsResult<()> {
        if ino == control::DIR_ID {
            let names: Vec<(NodeId, u32, &str)> = [
                (control::DIR_ID, libc::S_IFDIR, "."),
                (NodeId::ROOT, libc::S_IFDIR, ".."),
            ]
            .into_iter()
            .chain(
                ControlFile::ALL
                    .iter()
                    .map(|f| (f.id(), libc::S_IFREG, f.name())),
            )
            .collect();
            for (i, (id, kind, name)) in names.into_iter().enumerate().skip(offset as usize) {
                let e = DirEntryOut {
                    ino: id,
                    offset: i as u64 + 1,
                    kind,
                    name: OsStr::new(name),
                    attr: plus.then(|| self.control_attr(id)),
                };
                if add(&e) {
                    break;
                }
            }
            return Ok(());
        }
        let h = self.dirs.get(fh)?;
        let at_root = h.inode.id == NodeId::ROOT;
        let full = h.with_stream(|stream| {
            stream.seek(offset);
            self.list_from(&h.inode, stream, plus, &mut add)
        })?;
        if at_root && !full {
            // `.smithfs` after the real entries; its cookie is past every telldir value.
            let e = DirEntryOut {
                ino: control::DIR_ID,
                offset: i64::MAX as u64,
                kind: libc::S_IFDIR,
                name: OsStr::new(control::DIR_NAME),
                attr: plus.then(|| self.control_attr(control::DIR_ID)),
            };
            if offset != i64::MAX as u64 {
                add(&e);
            }
        }
        Ok(())
    }

    /// Feed the entries of `stream` (a listing of `dir`) to `add` until it returns `true`
    /// (buffer full: returns `true`) or the listing ends (`false`). See `readdir`.
    fn list_from(
        &self,
        dir: &super::inode::Inode,
        stream: &mut backing::DirStream,
        plus: bool,
        add: &mut impl FnMut(&DirEntryOut<'_>) -> bool,
    ) -> FsResult<bool> {
        while let Some(ent) = stream.next_entry()? {
            let name = OsStr::from_bytes(&ent.name);
            if Self::reserved(dir.id, name) {
                continue;
            }
            let dot = ent.name == b"." || ent.name == b"..";
            let kind = u32::from(ent.kind) << 12;
            let mut out = DirEntryOut {
                ino: self.inodes.ids.node_id(ent.ino),
                offset: ent.next_offset,
                kind,
                name,
                attr: None,
            };
            if plus {
                if dot {
                    // SAFETY: an all-zero stat is a valid value.
                    let mut st: libc::stat = unsafe { std::mem::zeroed() };
                    st.st_ino = ent.ino.0;
                    st.st_mode = kind;
                    out.attr = Some(Attr(st));
                } else if let Some(attr) = self.listed_known(dir, &ent) {
                    out.attr = Some(attr);
                } else {
                    let cname = CString::new(ent.name.clone()).map_err(|_| FsError::BadName)?;
                    match self.lookup_in(dir, &cname) {
                        Ok((_, attr)) => {
                            out.ino = attr.node();
                            out.attr = Some(attr);
                        }
                        // Removed since it was listed: skip it.
                        Err(_) => continue,
                    }
                }
            }
            if add(&out) {
                if plus && !dot {
                    self.inodes.forget(out.ino, 1);
                }
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The attributes of a listed entry the table already holds, with one more kernel reference
    /// counted (READDIRPLUS counts as a lookup of each entry): one `fstat` of the held
    /// descriptor instead of a lookup by name (`openat2`, `fstat`, `close`). The entry's inode
    /// number is the one `getdents` just returned, as racy as any listing; `None` (look it up by
    /// name) when the inode is not held, its descriptor was evicted, it has no names left, or it
    /// is another file now.
    fn listed_known(&self, dir: &super::inode::Inode, ent: &backing::DirEntry) -> Option<Attr> {
        let inode = self.inodes.find(self.inodes.ids.node_id(ent.ino))?;
        let fd = inode.held_fd()?;
        let st = backing::stat(fd.as_fd()).ok()?;
        if st.st_nlink == 0 || st.st_ino != ent.ino.0 || st.st_mode & libc::S_IFMT != inode.kind {
            return None;
        }
        self.named_again(&inode, dir, &ent.name, st)
    }

    /// Close the directory handle `fh` (FUSE releasedir).
    pub fn releasedir(&self, ino: NodeId, fh: Fh) -> FsResult<()> {
        if ino == control::DIR_ID {
            return Ok(());
        }
        self.dirs.remove(fh).map(drop).ok_or(FsError::Stale)
    }

    /// Flush a directory (FUSE fsyncdir).
    pub fn fsyncdir(&self, ino: NodeId, fh: Fh, datasync: bool) -> FsResult<()> {
        if ino == control::DIR_ID {
            return Ok(());
        }
        let h = self.dirs.get(fh)?;
        h.with_stream(|stream| Ok(backing::fsync(stream.fd(), datasync)?))
    }

    /// Filesystem statistics of the store (FUSE statfs).
    pub fn statfs(&self, ino: NodeId) -> FsResult<libc::statvfs> {
        let inode = self.inodes.get(ino).unwrap_or_else(|_| self.inodes.root());
        Ok(backing::statfs(inode.fd()?.as_fd())?)
    }
}
