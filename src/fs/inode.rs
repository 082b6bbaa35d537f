//! The inode table: every inode the kernel knows, keyed by FUSE node id, each reachable through
//! an `O_PATH` descriptor.
//!
//! Descriptors are a cache, not a per-inode cost: the kernel may hold far more inodes than the
//! process may have descriptors (a census of a large tree holds hundreds of thousands). When the
//! number of held descriptors passes a budget, the least recently used are closed and reopened
//! by kernel file handle on next use (`open_by_handle_at`, root only); an inode's handle is
//! taken when its descriptor is first closed so, not for every new inode. Without file handles
//! every descriptor stays open.
//!
//! Node ids are the backing store's inode numbers (stable across remounts; hard links share
//! one), except that the store's root is node 1 (`FUSE_NodeId::ROOT`) and a backing inode numbered 1
//! takes the root's number instead. Lock order: the table lock is a leaf; it is never held across
//! a syscall or a reply.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::{Mutex, RwLock};
use rustc_hash::FxHashMap;

use super::backing;
use super::error::{FsError, FsResult};
use super::ids::{BackingIno, NodeId};
use crate::policy::zone::Zone;

/// One inode the kernel holds references to.
#[derive(Debug)]
pub struct Inode {
    /// FUSE node id (see the module docs).
    pub id: NodeId,
    /// `O_PATH | O_NOFOLLOW` descriptor of the backing inode, while cached.
    fd: Mutex<Option<Arc<OwnedFd>>>,
    /// Kernel file handle to reopen the inode after its descriptor was evicted: taken at the
    /// first eviction (a syscall most inodes never need); `None` inside when it cannot be (the
    /// descriptor then stays), set to `None` for the root, which is never evicted.
    kernel_handle: OnceLock<Option<backing::KernelFileHandle>>,
    /// Used since the last eviction sweep (second-chance bit).
    used: AtomicBool,
    /// The descriptor budget shared by all inodes of the table.
    budget: Arc<FdBudget>,
    /// `S_IFMT` bits of the inode's mode.
    pub kind: u32,
    /// Backing device, to tell a reused inode number from the same file.
    pub dev: u64,
    /// Kernel lookup count; the inode is dropped from the table when it reaches zero.
    nlookup: AtomicU64,
    /// The link count (`st_nlink`) last seen in the store: more than the names in `place`
    /// means names the daemon has not seen (hard links made outside the mount).
    nlink: AtomicU64,
    /// Where the inode sits in the tree (its zone), kept up to date by lookups and renames.
    pub place: Mutex<Place>,
    /// FUSE passthrough state of a regular file (see [`Passthrough`]).
    pub passthrough: Mutex<Passthrough>,
}

/// An opaque kernel backing-file registration (the FUSE layer's `FUSE_DEV_IOC_BACKING_OPEN`), dropped — and
/// thereby closed in the kernel — when its last user goes.
pub type BackingRef = Arc<dyn std::any::Any + Send + Sync>;

/// Whether opens of an inode pass reads and writes straight to the backing file in the kernel.
/// The kernel will not mix a cached and a passthrough open, or two backing files, on one inode:
/// while any handle is open every open shares one backing registration, made from an `O_RDWR`
/// descriptor; an inode whose `O_RDWR` open fails is never passed through.
#[derive(Default)]
pub enum Passthrough {
    /// No open handle uses passthrough now.
    #[default]
    Idle,
    /// `users` open handles share `backing`.
    Active {
        /// The registration.
        backing: BackingRef,
        /// Open handles using it.
        users: u32,
    },
    /// `users` open handles go through the daemon (a setuid/setgid file: writes must clear
    /// those bits as the writer, which a passthrough write done with the daemon's credentials
    /// would not); new opens join them until all are closed.
    Cached {
        /// Open handles not passed through.
        users: u32,
    },
    /// This inode could not be opened `O_RDWR`: its opens are never passed through.
    Never,
}

impl std::fmt::Debug for Passthrough {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Passthrough::Idle => f.write_str("Idle"),
            Passthrough::Active { users, .. } => write!(f, "Active({users})"),
            Passthrough::Cached { users } => write!(f, "Cached({users})"),
            Passthrough::Never => f.write_str("Never"),
        }
    }
}

/// An inode's place in the tree: the name it was last reached by and its zone
/// (docs/SPEC.md §3: zones follow the tree; a new entry takes the zone of its directory), and
/// for a non-directory the other names (hard links) the daemon has seen.
#[derive(Debug, Clone)]
pub struct Place {
    /// Node id of the directory it was last looked up in (itself for the root).
    pub parent: NodeId,
    /// Its name there.
    pub name: Box<[u8]>,
    /// Its zone, valid while `epoch` equals the filesystem's zone epoch.
    pub zone: Zone,
    /// The zone epoch `zone` was computed in; `FIXED` for zones that never change.
    pub epoch: u64,
    /// Other names of the same file (hard links) seen through the mount: decisions take the
    /// intersection of the rights of all names (docs/SPEC.md §3). Empty for nearly every inode.
    pub others: Vec<Name>,
}

/// Another name of a non-directory: where the daemon has seen it and its zone.
#[derive(Debug, Clone)]
pub struct Name {
    /// Node id of its directory.
    pub parent: NodeId,
    /// The name in that directory.
    pub name: Box<[u8]>,
    /// Its zone, valid while `epoch` equals the filesystem's zone epoch.
    pub zone: Zone,
    /// The zone epoch `zone` was computed in.
    pub epoch: u64,
}

impl Name {
    /// Is this `name` in `parent`?
    pub fn is(&self, parent: NodeId, name: &[u8]) -> bool {
        self.parent == parent && *self.name == *name
    }
}

impl Place {
    /// Epoch marker of a zone that never needs recomputing (the root, virtual entries).
    pub const FIXED: u64 = u64::MAX;

    /// Other names kept at most per inode; beyond it a name is recorded only when its zone is
    /// new (the intersection needs every zone, not every name).
    const MAX_OTHERS: usize = 32;

    /// Now reached as `name` in `parent`, with `zone` valid in `epoch`.
    pub fn set(&mut self, parent: NodeId, name: &[u8], zone: Zone, epoch: u64) {
        self.parent = parent;
        self.name = name.into();
        self.zone = zone;
        self.epoch = epoch;
    }

    /// Is `name` in `parent` the name this place was last reached by?
    pub fn is(&self, parent: NodeId, name: &[u8]) -> bool {
        self.parent == parent && *self.name == *name
    }

    /// Record that the file (a non-directory) has the name `name` in `parent`, of `zone`. The
    /// first name becomes the place; further ones are kept as other names.
    pub fn add_name(&mut self, parent: NodeId, name: &[u8], zone: Zone, epoch: u64) {
        if self.epoch == 0 {
            self.set(parent, name, zone, epoch);
        } else if self.is(parent, name) {
            self.zone = zone;
            self.epoch = epoch;
        } else if let Some(o) = self.others.iter_mut().find(|o| o.is(parent, name)) {
            o.zone = zone;
            o.epoch = epoch;
        } else if self.others.len() < Self::MAX_OTHERS
            || (self.zone != zone && self.others.iter().all(|o| o.zone != zone))
        {
            self.others.push(Name {
                parent,
                name: name.into(),
                zone,
                epoch,
            });
        }
    }

    /// The name `name` in `parent` is gone (unlinked, or replaced by a rename). When it was the
    /// place, another known name takes over.
    pub fn remove_name(&mut self, parent: NodeId, name: &[u8]) {
        if self.is(parent, name) {
            if !self.others.is_empty() {
                let o = self.others.swap_remove(0);
                self.set(o.parent, &o.name, o.zone, o.epoch);
            }
        } else {
            self.others.retain(|o| !o.is(parent, name));
        }
    }

    /// The name `from` was renamed to `to` (of `zone`, valid in `epoch`).
    pub fn rename_name(
        &mut self,
        from: (NodeId, &[u8]),
        to: (NodeId, &[u8]),
        zone: Zone,
        epoch: u64,
    ) {
        let was_place = self.epoch == 0 || self.is(from.0, from.1) || self.is(to.0, to.1);
        self.others
            .retain(|o| !o.is(from.0, from.1) && !o.is(to.0, to.1));
        if was_place {
            self.set(to.0, to.1, zone, epoch);
        } else {
            self.add_name(to.0, to.1, zone, epoch);
        }
    }

    fn unknown() -> Place {
        Place {
            parent: NodeId::ROOT,
            name: Box::default(),
            zone: Zone::root(),
            epoch: 0,
            others: Vec::new(),
        }
    }
}

/// The shared budget of cached `O_PATH` descriptors.
#[derive(Debug)]
struct FdBudget {
    /// The store root opened for reading: the mount descriptor `open_by_handle_at` needs.
    root: OwnedFd,
    /// Descriptors held now.
    open: AtomicUsize,
    /// Sweep when `open` passes this.
    cap: usize,
    /// File handles work here (root, and a filesystem that has them).
    handles: bool,
}

/// A held `O_PATH` descriptor of an inode (kept open while borrowed, even if evicted meanwhile).
#[derive(Debug, Clone)]
pub struct PathFd(Arc<OwnedFd>);

impl AsFd for PathFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl Drop for Inode {
    fn drop(&mut self) {
        if self.fd.get_mut().is_some() {
            self.budget.open.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Inode {
    /// The inode's `O_PATH` descriptor, reopened by file handle if it was evicted.
    /// Errors: ESTALE when the inode is gone from the store.
    pub fn fd(&self) -> FsResult<PathFd> {
        self.used.store(true, Ordering::Relaxed);
        let mut slot = self.fd.lock();
        if let Some(f) = slot.as_ref() {
            return Ok(PathFd(f.clone()));
        }
        let handle = self
            .kernel_handle
            .get()
            .and_then(Option::as_ref)
            .ok_or(FsError::Stale)?;
        let f = Arc::new(backing::open_by_handle(self.budget.root.as_fd(), handle)?);
        *slot = Some(f.clone());
        self.budget.open.fetch_add(1, Ordering::Relaxed);
        Ok(PathFd(f))
    }

    /// The inode's descriptor if the table holds it now (no reopen: `None` when evicted).
    pub fn held_fd(&self) -> Option<PathFd> {
        let slot = self.fd.lock();
        let f = slot.as_ref()?;
        self.used.store(true, Ordering::Relaxed);
        Some(PathFd(f.clone()))
    }

    /// Chosen by a sweep: not used since the previous sweep (the second-chance bit is cleared on
    /// the way) and holding a descriptor. No syscall: the table's lock may be held.
    fn unused_since_last_sweep(&self) -> bool {
        !self.used.swap(false, Ordering::Relaxed)
            && self.fd.try_lock().is_some_and(|slot| slot.is_some())
    }

    /// Close the cached descriptor if the inode was not used since a sweep chose it and can be
    /// reopened; returns whether it was closed.
    fn evict(&self) -> bool {
        if !self.budget.handles || self.used.load(Ordering::Relaxed) {
            return false;
        }
        let mut slot = self.fd.lock();
        let Some(fd) = slot.as_ref() else {
            return false;
        };
        let handle = self
            .kernel_handle
            .get_or_init(|| backing::file_handle(fd.as_fd()).ok());
        if handle.is_none() {
            return false;
        }
        slot.take();
        self.budget.open.fetch_sub(1, Ordering::Relaxed);
        true
    }

    /// True for a directory.
    pub fn is_dir(&self) -> bool {
        self.kind == libc::S_IFDIR
    }

    /// The link count last seen in the store.
    pub fn links(&self) -> u64 {
        self.nlink.load(Ordering::Relaxed)
    }

    /// Note the link count just seen in the store (a stat, or a link or unlink through the
    /// mount).
    pub fn note_links(&self, n: u64) {
        self.nlink.store(n, Ordering::Relaxed);
    }
}

/// Map between backing inode numbers and node ids (see the module docs).
#[derive(Clone, Copy, Debug)]
pub struct IdMap {
    root_ino: BackingIno,
}

impl IdMap {
    /// Node id for backing inode `ino`.
    pub fn node_id(&self, ino: BackingIno) -> NodeId {
        if ino == self.root_ino {
            NodeId::ROOT
        } else if ino.0 == NodeId::ROOT.0 {
            NodeId(self.root_ino.0)
        } else {
            NodeId(ino.0)
        }
    }

    /// Backing inode number of node id `id` (the inverse of [`IdMap::node_id`]; not for the
    /// virtual control ids).
    pub fn backing_ino(&self, id: NodeId) -> BackingIno {
        if id == NodeId::ROOT {
            self.root_ino
        } else if id.0 == self.root_ino.0 {
            BackingIno(NodeId::ROOT.0)
        } else {
            BackingIno(id.0)
        }
    }
}

/// The table of known inodes.
#[derive(Debug)]
pub struct InodeTable {
    map: RwLock<FxHashMap<NodeId, Arc<Inode>>>,
    budget: Arc<FdBudget>,
    sweeping: Mutex<()>,
    /// Backing inode number mapping.
    pub ids: IdMap,
    /// Backing device of the store.
    pub dev: u64,
}

impl InodeTable {
    /// A table holding the store's root, given its `O_PATH` descriptor. `max_fds` bounds the
    /// cached descriptors (when file handles work on the store).
    pub fn new(root: OwnedFd, max_fds: usize) -> FsResult<InodeTable> {
        let st = backing::stat(root.as_fd())?;
        let root = Arc::new(root);
        let mount = backing::reopen(root.as_fd(), libc::O_RDONLY | libc::O_DIRECTORY)?;
        let handles = backing::file_handle(root.as_fd())
            .and_then(|h| backing::open_by_handle(mount.as_fd(), &h))
            .is_ok();
        let budget = Arc::new(FdBudget {
            root: mount,
            open: AtomicUsize::new(1),
            cap: max_fds.max(64),
            handles,
        });
        let root_inode = Arc::new(Inode {
            id: NodeId::ROOT,
            fd: Mutex::new(Some(root)),
            kernel_handle: OnceLock::from(None),
            used: AtomicBool::new(true),
            budget: budget.clone(),
            kind: st.st_mode & libc::S_IFMT,
            dev: st.st_dev,
            // The root is never forgotten.
            nlookup: AtomicU64::new(1 << 62),
            nlink: AtomicU64::new(st.st_nlink),
            passthrough: Mutex::new(Passthrough::Never),
            place: Mutex::new(Place {
                parent: NodeId::ROOT,
                name: Box::default(),
                zone: Zone::root(),
                epoch: Place::FIXED,
                others: Vec::new(),
            }),
        });
        let mut map = FxHashMap::default();
        map.insert(NodeId::ROOT, root_inode);
        Ok(InodeTable {
            map: RwLock::new(map),
            budget,
            sweeping: Mutex::new(()),
            ids: IdMap {
                root_ino: BackingIno(st.st_ino),
            },
            dev: st.st_dev,
        })
    }

    /// The inode with node id `id`, or `Stale`. Sweeps the descriptor cache when reopened
    /// descriptors pushed it over budget.
    pub fn get(&self, id: NodeId) -> FsResult<Arc<Inode>> {
        if self.budget.open.load(Ordering::Relaxed) > self.budget.cap {
            self.sweep();
        }
        self.map.read().get(&id).cloned().ok_or(FsError::Stale)
    }

    /// The inode with node id `id`, if the kernel holds it.
    pub fn find(&self, id: NodeId) -> Option<Arc<Inode>> {
        self.map.read().get(&id).cloned()
    }

    /// The root inode.
    pub fn root(&self) -> Arc<Inode> {
        // The root is inserted at construction and never removed.
        self.map
            .read()
            .get(&NodeId::ROOT)
            .cloned()
            .expect("root inode present")
    }

    /// Register a lookup of the backing inode held by `fd` with attributes `st`: returns the
    /// inode (new or known) with its lookup count raised by one. A known node id whose old
    /// file is gone (its inode number reused by the store) is replaced by the new file.
    pub fn remember(&self, fd: OwnedFd, st: &libc::stat) -> Arc<Inode> {
        let id = self.ids.node_id(BackingIno(st.st_ino));
        let kind = st.st_mode & libc::S_IFMT;
        // Decide outside the lock whether a known inode is still this file (a syscall).
        let known = self.map.read().get(&id).cloned();
        let stale = known
            .as_ref()
            .filter(|k| k.kind != kind || k.dev != st.st_dev || is_gone(k));
        if let (Some(k), None) = (&known, stale) {
            let map = self.map.read();
            if let Some(current) = map.get(&id) {
                if Arc::ptr_eq(current, k) {
                    current.nlookup.fetch_add(1, Ordering::Relaxed);
                    return current.clone();
                }
            }
        }
        let mut map = self.map.write();
        if let Some(current) = map.get(&id) {
            let replaced = stale.is_some_and(|s| Arc::ptr_eq(s, current));
            if !replaced {
                current.nlookup.fetch_add(1, Ordering::Relaxed);
                return current.clone();
            }
        }
        let prior = map
            .get(&id)
            .map_or(0, |k| k.nlookup.load(Ordering::Relaxed));
        self.budget.open.fetch_add(1, Ordering::Relaxed);
        let inode = Arc::new(Inode {
            id,
            fd: Mutex::new(Some(Arc::new(fd))),
            kernel_handle: OnceLock::new(),
            used: AtomicBool::new(true),
            budget: self.budget.clone(),
            kind,
            dev: st.st_dev,
            nlookup: AtomicU64::new(prior + 1),
            nlink: AtomicU64::new(st.st_nlink),
            place: Mutex::new(Place::unknown()),
            passthrough: Mutex::new(Passthrough::Idle),
        });
        map.insert(id, inode.clone());
        drop(map);
        if self.budget.open.load(Ordering::Relaxed) > self.budget.cap {
            self.sweep();
        }
        inode
    }

    /// Count one more kernel reference to `inode` (a reply that names it again: a link, a
    /// READDIRPLUS entry; the kernel counts one more lookup). Returns false, counting nothing,
    /// when the table no longer holds it (forgotten meanwhile): the caller then looks it up anew.
    /// Under the table's read lock, so a concurrent FORGET (write lock) sees the new count.
    pub fn referenced_again(&self, inode: &Arc<Inode>) -> bool {
        let map = self.map.read();
        match map.get(&inode.id) {
            Some(held) if Arc::ptr_eq(held, inode) => {
                inode.nlookup.fetch_add(1, Ordering::Relaxed);
                true
            }
            _ => false,
        }
    }

    /// Close cached descriptors of inodes not used since the last sweep until half the budget
    /// is free again (second-chance eviction). One sweep at a time; others skip.
    ///
    /// A sweep runs on the request that pushed the table over budget, so it is kept short and
    /// rare: the victims are chosen in one pass under the table's read lock (atomics only, no
    /// syscall, no reference taken for inodes that stay) and evicted after it, a second pass
    /// when too many were used since the last sweep; an eviction costs a `close` (and a
    /// `name_to_handle_at` at an inode's first eviction). Freeing half the budget makes a sweep every
    /// `cap / 2` new descriptors: with 40 000 inodes held and a cap of 7 300 the previous rule (a
    /// tenth free, every inode collected and visited twice) stalled a request for 14–20 ms every
    /// 730 creates.
    fn sweep(&self) {
        let Some(_one) = self.sweeping.try_lock() else {
            return;
        };
        if !self.budget.handles {
            return;
        }
        let want = self
            .budget
            .open
            .load(Ordering::Relaxed)
            .saturating_sub(self.budget.cap / 2);
        let mut evicted = 0;
        for _pass in 0..2 {
            let victims: Vec<Arc<Inode>> = {
                let map = self.map.read();
                map.values()
                    .filter(|inode| inode.unused_since_last_sweep())
                    .take(want - evicted)
                    .cloned()
                    .collect()
            };
            evicted += victims.iter().filter(|inode| inode.evict()).count();
            if evicted >= want {
                break;
            }
        }
    }

    /// Descriptors held now by the table (for status and tests).
    pub fn open_fds(&self) -> usize {
        self.budget.open.load(Ordering::Relaxed)
    }

    /// Drop `n` kernel references to `id`; forget the inode when none remain. Returns whether
    /// it was forgotten.
    pub fn forget(&self, id: NodeId, n: u64) -> bool {
        if id == NodeId::ROOT {
            return false;
        }
        let mut map = self.map.write();
        let Some(inode) = map.get(&id) else {
            return false;
        };
        let left = inode.nlookup.load(Ordering::Relaxed).saturating_sub(n);
        inode.nlookup.store(left, Ordering::Relaxed);
        if left > 0 {
            return false;
        }
        let gone = map.remove(&id);
        // Close the descriptor after the lock: the last close of an unlinked file frees it in
        // the store (ext4 truncates it and releases its blocks in that close), and every
        // request waits for this lock meanwhile.
        drop(map);
        drop(gone);
        true
    }

    /// Number of inodes held (for status and tests).
    pub fn len(&self) -> usize {
        self.map.read().len()
    }

    /// True when only the root is held.
    pub fn is_empty(&self) -> bool {
        self.len() <= 1
    }
}

/// True when the known file has no names left (its inode number may have been reused). While
/// the table holds its descriptor the store cannot free the inode, so its number still names
/// it: no syscall then (a lookup of a known inode, e.g. each READDIRPLUS entry, would pay one).
fn is_gone(inode: &Inode) -> bool {
    if inode.fd.lock().is_some() {
        return false;
    }
    match inode.fd() {
        Ok(fd) => matches!(backing::stat(fd.as_fd()), Ok(st) if st.st_nlink == 0),
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use super::*;

    fn z(name: &str) -> Zone {
        Zone::root().child_zone(OsStr::new(name))
    }

    fn names(p: &Place) -> Vec<(NodeId, Vec<u8>)> {
        let mut v: Vec<(NodeId, Vec<u8>)> = std::iter::once((p.parent, p.name.to_vec()))
            .chain(p.others.iter().map(|o| (o.parent, o.name.to_vec())))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn names_are_added_once_renamed_and_removed() {
        let mut p = Place::unknown();
        p.add_name(NodeId(10), b"a", z("results"), 1);
        assert!(p.is(NodeId(10), b"a") && p.others.is_empty());
        p.add_name(NodeId(10), b"a", z("results"), 2);
        p.add_name(NodeId(11), b"b", z("agents"), 2);
        p.add_name(NodeId(11), b"b", z("agents"), 2);
        assert_eq!(
            names(&p),
            [(NodeId(10), b"a".to_vec()), (NodeId(11), b"b".to_vec())]
        );
        // Renaming another name keeps the place; renaming the place moves it.
        p.rename_name((NodeId(11), b"b"), (NodeId(12), b"c"), z("agents"), 3);
        assert!(p.is(NodeId(10), b"a"));
        assert_eq!(
            names(&p),
            [(NodeId(10), b"a".to_vec()), (NodeId(12), b"c".to_vec())]
        );
        p.rename_name((NodeId(10), b"a"), (NodeId(10), b"d"), z("results"), 3);
        assert!(p.is(NodeId(10), b"d"));
        assert_eq!(
            names(&p),
            [(NodeId(10), b"d".to_vec()), (NodeId(12), b"c".to_vec())]
        );
        // Removing the place promotes another known name.
        p.remove_name(NodeId(10), b"d");
        assert!(p.is(NodeId(12), b"c") && p.others.is_empty());
        assert_eq!(p.zone, z("agents"));
        p.remove_name(NodeId(99), b"x");
        assert!(p.is(NodeId(12), b"c"));
    }

    #[test]
    fn many_names_keep_every_zone() {
        let mut p = Place::unknown();
        p.add_name(NodeId(1), b"first", z("results"), 1);
        for i in 0..100u32 {
            p.add_name(NodeId(2), format!("n{i}").as_bytes(), z("results"), 1);
        }
        assert_eq!(p.others.len(), Place::MAX_OTHERS);
        p.add_name(NodeId(3), b"elsewhere", z("agents"), 1);
        assert!(p.others.iter().any(|o| o.zone == z("agents")));
    }

    /// Past its budget the table keeps at most the cap of descriptors, frees half of it per
    /// sweep, and every inode still reaches its file (reopened by kernel file handle). Without
    /// file handles (not root) nothing can be evicted and every descriptor stays.
    #[test]
    fn eviction_keeps_the_budget_and_every_inode_reachable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let n = 500;
        for i in 0..n {
            std::fs::write(dir.path().join(format!("f{i}")), i.to_string()).expect("write");
        }
        let root = backing::open_store_root(dir.path()).expect("root");
        let table = InodeTable::new(root, 64).expect("table");
        let mut held = Vec::new();
        for i in 0..n {
            let name = std::ffi::CString::new(format!("f{i}")).expect("name");
            let fd = backing::lookup(table.root().fd().expect("root fd").as_fd(), &name)
                .expect("lookup");
            let st = backing::stat(fd.as_fd()).expect("stat");
            held.push((table.remember(fd, &st), st.st_ino));
            if table.budget.handles {
                assert!(
                    table.open_fds() <= 64 + 1,
                    "{} held at {i}",
                    table.open_fds()
                );
            }
        }
        if table.budget.handles {
            assert!(table.open_fds() <= 64, "{}", table.open_fds());
        } else {
            assert_eq!(table.open_fds(), n + 1);
        }
        for (inode, ino) in &held {
            let st = backing::stat(inode.fd().expect("reopen").as_fd()).expect("stat");
            assert_eq!(st.st_ino, *ino);
        }
    }
}
