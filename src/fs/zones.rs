//! Zones of inodes and of names, hard-link names, and the zone-based policy checks (docs/SPEC.md §3).

use std::ffi::{CStr, OsStr};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering;

use super::error::FsResult;
use super::ids::{BackingIno, NodeId};
use super::inode::{Inode, Name, Place};
use super::{backing, control, Caller, SmithFs};
use crate::identity::Identity;
use crate::policy::{self, decide, decide_unseen_names, Decision, Op, Zone};

impl SmithFs {
    /// Decide `op` on `inode` (docs/SPEC.md §3). A file with one link — nearly every inode — is
    /// judged by the zone of its name, at the cost of one `decide`. A file with several names is
    /// judged by the intersection of the rights of every name the daemon has seen; when its link
    /// count says it has names the daemon has not seen (hard links made in the store behind the
    /// mount's back), it fails closed — only the operator and the owner of the zone of the name
    /// it is reached by keep their rights — unless a fresh look at the directories of its known
    /// names finds them all (docs/PROTOCOL-NOTES.md, C24).
    pub(super) fn decide_inode(&self, who: Identity, op: Op, inode: &Inode) -> Decision {
        let zone = self.zone(inode);
        let d = self.decide_zone(who, op, &zone);
        let links = inode.links();
        if !d.is_allowed() || inode.is_dir() || links <= 1 {
            return d;
        }
        let others = self.other_zones(inode);
        let d = self.decide_zones(who, op, &others);
        if !d.is_allowed() || others.len() as u64 + 1 >= links {
            return d;
        }
        let closed = self.with_ctx(|ctx| decide_unseen_names(&who, op, &zone, ctx));
        if closed.is_allowed() {
            return d;
        }
        match self.find_names(inode) {
            Some(zones) => self.decide_zones(who, op, &zones),
            None => closed,
        }
    }

    /// Decide `op` on every zone of `zones` (allowed when empty).
    pub(super) fn decide_zones(&self, who: Identity, op: Op, zones: &[Zone]) -> Decision {
        self.with_ctx(|ctx| policy::decide_all(&who, op, zones, ctx))
    }

    /// The zones of the other names of `inode` the daemon has seen, recomputed from their parent
    /// chains when a directory rename made them stale. Empty for nearly every inode.
    pub(super) fn other_zones(&self, inode: &Inode) -> Vec<Zone> {
        let epoch = self.zone_epoch.load(Ordering::Acquire);
        let others: Vec<Name> = {
            let p = inode.place.lock();
            if p.others.iter().all(|o| o.epoch == epoch) {
                return p.others.iter().map(|o| o.zone).collect();
            }
            p.others.clone()
        };
        let mut zones = Vec::with_capacity(others.len());
        for o in &others {
            let zone = if o.epoch == epoch {
                o.zone
            } else {
                let zone = self
                    .entry_zone(o.parent, &o.name, inode.id, false)
                    .unwrap_or(o.zone);
                let mut p = inode.place.lock();
                if let Some(known) = p.others.iter_mut().find(|k| k.is(o.parent, &o.name)) {
                    known.zone = zone;
                    known.epoch = epoch;
                }
                zone
            };
            zones.push(zone);
        }
        zones
    }

    /// Look for every name of the non-directory `inode` in the directories of the names the
    /// daemon has seen (a fresh `stat`, and one `readdir` of each directory, at most
    /// [`Self::SCAN_MAX`] entries in all). When as many names as the link count were found they
    /// are recorded and their zones returned; else `None` (some name is elsewhere).
    pub(super) fn find_names(&self, inode: &Inode) -> Option<Vec<Zone>> {
        let st = backing::stat(inode.fd().ok()?.as_fd()).ok()?;
        inode.note_links(st.st_nlink);
        let mut dirs: Vec<NodeId> = {
            let p = inode.place.lock();
            std::iter::once(p.parent)
                .chain(p.others.iter().map(|o| o.parent))
                .collect()
        };
        dirs.sort_unstable();
        dirs.dedup();
        let mut found: Vec<(NodeId, Vec<u8>)> = Vec::new();
        let mut budget = Self::SCAN_MAX;
        for id in dirs {
            let Some(dir) = self.inodes.find(id) else {
                continue;
            };
            let Ok(fd) = dir.fd() else {
                continue;
            };
            let Ok(mut stream) = backing::DirStream::open(fd.as_fd()) else {
                continue;
            };
            while let Ok(Some(ent)) = stream.next_entry() {
                budget = budget.checked_sub(1)?;
                if ent.ino == BackingIno::of(&st) && ent.name != b"." && ent.name != b".." {
                    found.push((id, ent.name));
                }
            }
        }
        found.sort_unstable();
        found.dedup();
        if (found.len() as u64) < st.st_nlink {
            return None;
        }
        let epoch = self.zone_epoch.load(Ordering::Acquire);
        let mut named = Vec::with_capacity(found.len());
        for (dir, name) in found {
            let zone = self.entry_zone(dir, &name, inode.id, false)?;
            named.push((dir, name, zone));
        }
        let mut p = inode.place.lock();
        if !named.iter().any(|(d, n, _)| p.is(*d, n)) {
            let (d, n, z) = &named[0];
            p.set(*d, n, *z, epoch);
        }
        p.others.clear();
        for (d, n, z) in &named {
            p.add_name(*d, n, *z, epoch);
        }
        Some(named.into_iter().map(|(_, _, z)| z).collect())
    }

    /// Directory entries [`Self::find_names`] reads at most before it gives up (fails closed).
    const SCAN_MAX: usize = 100_000;

    pub(super) fn decide_zone(&self, who: Identity, op: Op, zone: &Zone) -> Decision {
        self.with_ctx(|ctx| decide(&who, op, zone, ctx))
    }

    /// Check `op` on `inode` for the caller.
    pub(super) fn check_inode(
        &self,
        caller: &Caller,
        who: Identity,
        op: Op,
        label: &str,
        inode: &Inode,
    ) -> FsResult<()> {
        let d = self.decide_inode(who, op, inode);
        self.enforce(caller, who, d, label, || self.path_of(inode))
    }

    /// The zone of `inode`, recomputed from its parent chain when a directory rename made the
    /// cached one stale.
    pub fn zone(&self, inode: &Inode) -> Zone {
        let epoch = self.zone_epoch.load(Ordering::Acquire);
        let (parent, name, cached) = {
            let p = inode.place.lock();
            if p.epoch == Place::FIXED || p.epoch == epoch {
                return p.zone;
            }
            (p.parent, p.name.clone(), p.zone)
        };
        let zone = self
            .entry_zone(parent, &name, inode.id, inode.is_dir())
            .unwrap_or(cached);
        let mut p = inode.place.lock();
        if p.parent == parent && p.name == name {
            p.zone = zone;
            p.epoch = epoch;
        }
        zone
    }

    /// The zone of the entry `name` (node id `id`, if it exists) in directory `parent`.
    pub(super) fn entry_zone(
        &self,
        parent: NodeId,
        name: &[u8],
        id: NodeId,
        is_dir: bool,
    ) -> Option<Zone> {
        if is_dir {
            if let Some((idx, par, level)) = self.registry.smith_at(self.inodes.ids.backing_ino(id))
            {
                return Some(Zone::smith_dir(idx, par, level));
            }
        }
        if parent == NodeId::ROOT && name == control::DIR_NAME.as_bytes() && id == control::DIR_ID {
            return Some(Zone::root().child_zone(OsStr::from_bytes(name)));
        }
        let dir = self.inodes.find(parent)?;
        Some(self.zone(&dir).child_zone(OsStr::from_bytes(name)))
    }

    /// The zone a new entry `name` gets in `dir` (never a registered smith dir).
    pub(super) fn new_zone(&self, dir: &Inode, name: &OsStr) -> Zone {
        self.zone(dir).child_zone(name)
    }

    /// The zone of the existing entry `name` in `dir` (a registered smith dir is found by its
    /// backing inode number).
    pub(super) fn existing_zone(
        &self,
        dir: &Inode,
        cname: &CStr,
        name: &OsStr,
    ) -> FsResult<(Zone, libc::stat)> {
        let st = backing::stat_at(dir.fd()?.as_fd(), cname)?;
        if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            if let Some((idx, par, level)) = self.registry.smith_at(BackingIno::of(&st)) {
                return Ok((Zone::smith_dir(idx, par, level), st));
            }
        }
        Ok((self.new_zone(dir, name), st))
    }

    /// Mount-relative path of `inode`, from its parent chain (for messages only).
    pub fn path_of(&self, inode: &Inode) -> String {
        let mut parts: Vec<Box<[u8]>> = Vec::new();
        let mut cur = inode.id;
        for _ in 0..256 {
            if cur == NodeId::ROOT {
                break;
            }
            let Some(node) = self.inodes.find(cur) else {
                parts.push(Box::from(&b"?"[..]));
                break;
            };
            let p = node.place.lock();
            parts.push(p.name.clone());
            cur = p.parent;
        }
        parts.reverse();
        let joined: Vec<String> = parts
            .iter()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .collect();
        joined.join("/")
    }

    pub(super) fn child_path(&self, dir: &Inode, name: &OsStr) -> String {
        let base = self.path_of(dir);
        if base.is_empty() {
            name.to_string_lossy().into_owned()
        } else {
            format!("{base}/{}", name.to_string_lossy())
        }
    }

    /// The zone `inode` has as `name` in `dir`, and the epoch it is valid in.
    pub(super) fn zone_for(&self, inode: &Inode, dir: &Inode, name: &[u8]) -> (Zone, u64) {
        let epoch = self.zone_epoch.load(Ordering::Acquire);
        let zone = self
            .entry_zone(dir.id, name, inode.id, inode.is_dir())
            .unwrap_or_else(Zone::root);
        (zone, epoch)
    }

    /// Record that `inode` was reached as `name` in `dir`, with the link count `nlink` just seen.
    /// A directory or a file with one link has exactly this name; a file with several keeps its
    /// other names too.
    pub(super) fn place(&self, inode: &Inode, dir: &Inode, name: &[u8], nlink: u64) {
        inode.note_links(nlink);
        {
            let p = inode.place.lock();
            if p.epoch != 0 && p.is(dir.id, name) && (nlink > 1 || p.others.is_empty()) {
                return;
            }
        }
        let (zone, epoch) = self.zone_for(inode, dir, name);
        let mut p = inode.place.lock();
        if p.epoch == Place::FIXED {
            return;
        }
        if inode.is_dir() || nlink <= 1 {
            p.set(dir.id, name, zone, epoch);
            p.others.clear();
        } else {
            p.add_name(dir.id, name, zone, epoch);
        }
    }

    /// Update the place of a renamed inode whose `stat` before the rename was `st` (if the kernel
    /// holds it): the name `from` (directory node id, name) is now `name` in `dir`. A file with
    /// other names keeps them: the rename moved one name, not the inode.
    pub(super) fn moved(&self, st: &libc::stat, from: (NodeId, &[u8]), dir: &Inode, name: &[u8]) {
        let Some(inode) = self
            .inodes
            .find(self.inodes.ids.node_id(BackingIno::of(st)))
        else {
            return;
        };
        let (zone, epoch) = self.zone_for(&inode, dir, name);
        let mut p = inode.place.lock();
        if inode.is_dir() || st.st_nlink <= 1 {
            p.set(dir.id, name, zone, epoch);
            p.others.clear();
        } else {
            p.rename_name(from, (dir.id, name), zone, epoch);
        }
    }

    /// The name `name` in directory `dir` of the non-directory whose `stat` before the removal
    /// was `st` is gone (unlink, or replaced by a rename): forget the name and note one link less
    /// (if the kernel holds the inode).
    pub(super) fn unnamed(&self, st: &libc::stat, dir: NodeId, name: &[u8]) {
        let Some(inode) = self
            .inodes
            .find(self.inodes.ids.node_id(BackingIno::of(st)))
        else {
            return;
        };
        if inode.is_dir() {
            return;
        }
        inode.note_links(st.st_nlink.saturating_sub(1));
        inode.place.lock().remove_name(dir, name);
    }
}
