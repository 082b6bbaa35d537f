//! The smith registry: every smith dir smithfs made or found, with its place in the tree
//! (docs/SPEC.md §1). A directory is a smith dir because it is registered here — by the scaffold
//! or the start-up scan — never because of its name.
//!
//! Smith dirs are known by their backing inode number, so a decision finds "is this directory a
//! smith dir?" with one hash lookup and no path. Lock order: `Registry::inner` is a leaf lock;
//! a family lock (`Registry::family`) is taken before `inner` and held across the scaffold's
//! syscalls, serialising the mkdirs of one parent (docs/SPEC.md §4).

use rustc_hash::FxHashMap;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use super::model::{FullId, SmithIdx, ROOT_ID};
use crate::backing::BackingIno;

/// One registered smith.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SmithInfo {
    /// Its index.
    pub idx: SmithIdx,
    /// Short id: `smith-root`, `smith-001`.
    pub id: String,
    /// Full id: `smith-root/smith-001`.
    pub full_id: FullId,
    /// Its parent; `None` for the root.
    pub parent: Option<SmithIdx>,
    /// Level: root 0.
    pub level: u8,
    /// Its children, in creation order.
    pub children: Vec<SmithIdx>,
    /// The highest child number it ever used (remembered across restarts).
    pub highest_child: Option<u32>,
    /// Backing inode number of its smith dir.
    pub dir_ino: BackingIno,
}

impl SmithInfo {
    /// The smith dir relative to the mount root: `smiths/smith-root/children/smith-001`.
    pub fn rel_dir(&self) -> String {
        self.full_id.smith_path()
    }
}

#[derive(Debug, Default)]
struct Inner {
    smiths: Vec<SmithInfo>,
    by_full_id: FxHashMap<FullId, SmithIdx>,
    by_ino: FxHashMap<BackingIno, SmithIdx>,
}

/// All registered smiths.
#[derive(Debug, Default)]
pub struct Registry {
    inner: RwLock<Inner>,
    families: Mutex<FxHashMap<SmithIdx, Arc<Mutex<()>>>>,
}

impl Registry {
    /// The `status.json` document (docs/SPEC.md §7) of the registered tree with every smith idle,
    /// no runs and no result: what `.smithfs/status.json` serves before the scheduler has
    /// published, or on a mount without a scheduler. Shape: `{"smiths": [{"full_id", "parent",
    /// "level", "state", "runs", "has_result", "last_run"}], "agent_configured"}`.
    pub fn idle_status(&self, agent_configured: bool) -> serde_json::Value {
        let smiths: Vec<serde_json::Value> = self
            .all()
            .into_iter()
            .map(|s| {
                serde_json::json!({
                    "full_id": s.full_id,
                    "parent": s.parent.and_then(|p| self.full_id(p)),
                    "level": s.level,
                    "state": "idle",
                    "runs": 0,
                    "has_result": false,
                    "last_run": null,
                })
            })
            .collect();
        serde_json::json!({"smiths": smiths, "agent_configured": agent_configured})
    }

    /// An empty registry.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Register a smith dir with backing inode `dir_ino` as child `id` of `parent` (`None`:
    /// the root, whose `id` is `smith-root`). Returns its index; registering the same full id
    /// again returns the first index with the inode number updated. `None` when `id` is not a
    /// child name ([`super::model::parse_child_name`]) or `parent` is not registered.
    pub fn register(
        &self,
        parent: Option<SmithIdx>,
        id: &str,
        dir_ino: BackingIno,
        highest_child: Option<u32>,
    ) -> Option<SmithIdx> {
        let mut inner = self.inner.write();
        let (full_id, level) = match parent {
            Some(p) => {
                let p = inner.smiths.get(p.0 as usize)?;
                (p.full_id.child(id)?, p.level + 1)
            }
            None if id == ROOT_ID => (FullId::root(), 0),
            None => return None,
        };
        if let Some(&idx) = inner.by_full_id.get(&full_id) {
            let old = inner.smiths[idx.0 as usize].dir_ino;
            inner.by_ino.remove(&old);
            inner.smiths[idx.0 as usize].dir_ino = dir_ino;
            inner.by_ino.insert(dir_ino, idx);
            return Some(idx);
        }
        let idx = SmithIdx(inner.smiths.len() as u32);
        inner.smiths.push(SmithInfo {
            idx,
            id: id.to_string(),
            full_id: full_id.clone(),
            parent,
            level,
            children: Vec::new(),
            highest_child,
            dir_ino,
        });
        inner.by_full_id.insert(full_id, idx);
        inner.by_ino.insert(dir_ino, idx);
        if let Some(p) = parent {
            if let Some(p) = inner.smiths.get_mut(p.0 as usize) {
                p.children.push(idx);
            }
        }
        Some(idx)
    }

    /// The smith whose dir has backing inode number `ino`: (smith, parent, level).
    pub fn smith_at(&self, ino: BackingIno) -> Option<(SmithIdx, Option<SmithIdx>, u8)> {
        let inner = self.inner.read();
        let idx = *inner.by_ino.get(&ino)?;
        let s = &inner.smiths[idx.0 as usize];
        Some((idx, s.parent, s.level))
    }

    /// A copy of smith `idx`'s record.
    pub fn get(&self, idx: SmithIdx) -> Option<SmithInfo> {
        self.inner.read().smiths.get(idx.0 as usize).cloned()
    }

    /// The full id of `idx`.
    pub fn full_id(&self, idx: SmithIdx) -> Option<FullId> {
        self.inner
            .read()
            .smiths
            .get(idx.0 as usize)
            .map(|s| s.full_id.clone())
    }

    /// The smith with full id `full_id`.
    pub fn by_full_id(&self, full_id: &str) -> Option<SmithIdx> {
        self.inner.read().by_full_id.get(full_id).copied()
    }

    /// The root smith, if registered.
    pub fn root(&self) -> Option<SmithIdx> {
        self.by_full_id(ROOT_ID)
    }

    /// Is `a` an ancestor (strictly above) of `b`?
    pub fn is_ancestor(&self, a: SmithIdx, b: SmithIdx) -> bool {
        let inner = self.inner.read();
        let mut cur = inner.smiths.get(b.0 as usize).and_then(|s| s.parent);
        while let Some(c) = cur {
            if c == a {
                return true;
            }
            cur = inner.smiths.get(c.0 as usize).and_then(|s| s.parent);
        }
        false
    }

    /// Record that `idx` used child number `n`.
    pub fn note_child_number(&self, idx: SmithIdx, n: u32) {
        let mut inner = self.inner.write();
        if let Some(s) = inner.smiths.get_mut(idx.0 as usize) {
            s.highest_child = Some(s.highest_child.map_or(n, |h| h.max(n)));
        }
    }

    /// Forget smith `child` and its whole subtree (its dir was removed by the operator).
    /// Returns the smiths forgotten now (`child` first, then its descendants); empty if `child`
    /// was not registered or already forgotten.
    pub fn unregister(&self, child: SmithIdx) -> Vec<SmithIdx> {
        let mut inner = self.inner.write();
        let Some(info) = inner.smiths.get(child.0 as usize).cloned() else {
            return Vec::new();
        };
        if inner.by_full_id.get(&info.full_id) != Some(&child) {
            return Vec::new();
        }
        if let Some(p) = info.parent {
            if let Some(p) = inner.smiths.get_mut(p.0 as usize) {
                p.children.retain(|c| *c != child);
            }
        }
        let mut gone = Vec::new();
        let mut stack = vec![child];
        while let Some(idx) = stack.pop() {
            let Some(s) = inner.smiths.get(idx.0 as usize).cloned() else {
                continue;
            };
            if inner.by_ino.get(&s.dir_ino) == Some(&idx) {
                inner.by_ino.remove(&s.dir_ino);
            }
            if inner.by_full_id.get(&s.full_id) == Some(&idx) {
                inner.by_full_id.remove(&s.full_id);
                gone.push(idx);
            }
            stack.extend(s.children);
        }
        gone
    }

    /// Smith `idx` and its registered descendants, parents before children; empty if `idx` is
    /// not registered.
    pub fn subtree(&self, idx: SmithIdx) -> Vec<SmithInfo> {
        let inner = self.inner.read();
        let mut out = Vec::new();
        let mut queue = std::collections::VecDeque::from([idx]);
        while let Some(i) = queue.pop_front() {
            let Some(s) = inner.smiths.get(i.0 as usize) else {
                continue;
            };
            if inner.by_full_id.get(&s.full_id) != Some(&i) {
                continue;
            }
            queue.extend(s.children.iter().copied());
            out.push(s.clone());
        }
        out
    }

    /// Every registered smith, in registration order (parents before children).
    pub fn all(&self) -> Vec<SmithInfo> {
        let inner = self.inner.read();
        inner
            .smiths
            .iter()
            .filter(|s| inner.by_full_id.get(&s.full_id) == Some(&s.idx))
            .cloned()
            .collect()
    }

    /// The lock that serialises creating children of `idx` (docs/SPEC.md §4).
    pub fn family(&self, idx: SmithIdx) -> Arc<Mutex<()>> {
        self.families.lock().entry(idx).or_default().clone()
    }

    /// Highest child number per full id, for persisting across restarts.
    pub fn highest_children(&self) -> Vec<(FullId, u32)> {
        self.all()
            .into_iter()
            .filter_map(|s| s.highest_child.map(|h| (s.full_id, h)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_a_tree() {
        let r = Registry::new();
        let root = r
            .register(None, "smith-root", BackingIno(10), None)
            .unwrap();
        let a = r
            .register(Some(root), "smith-001", BackingIno(11), None)
            .unwrap();
        let b = r
            .register(Some(a), "smith-003", BackingIno(12), Some(7))
            .unwrap();
        assert_eq!(
            r.full_id(b).as_deref(),
            Some("smith-root/smith-001/smith-003")
        );
        assert_eq!(r.smith_at(BackingIno(11)), Some((a, Some(root), 1)));
        assert_eq!(r.get(b).map(|s| s.level), Some(2));
        assert_eq!(
            r.get(b).map(|s| s.rel_dir()).as_deref(),
            Some("smiths/smith-root/children/smith-001/children/smith-003")
        );
        assert!(r.is_ancestor(root, b));
        assert!(!r.is_ancestor(b, root));
        assert_eq!(r.root(), Some(root));
        assert_eq!(r.by_full_id("smith-root/smith-001"), Some(a));
        r.note_child_number(root, 4);
        r.note_child_number(root, 2);
        assert_eq!(r.get(root).and_then(|s| s.highest_child), Some(4));
        assert_eq!(r.unregister(b), vec![b]);
        assert_eq!(r.smith_at(BackingIno(12)), None);
        assert_eq!(r.get(a).map(|s| s.children.len()), Some(0));
        assert_eq!(r.unregister(b), Vec::new(), "already forgotten");
        let c = r
            .register(Some(a), "smith-004", BackingIno(13), None)
            .unwrap();
        let d = r
            .register(Some(c), "smith-001", BackingIno(14), None)
            .unwrap();
        assert_eq!(
            r.unregister(a),
            vec![a, c, d],
            "the whole subtree, parents first"
        );
        assert_eq!(r.all().len(), 1);
    }

    #[test]
    fn subtree_lists_parents_first() {
        let r = Registry::new();
        let root = r
            .register(None, "smith-root", BackingIno(10), None)
            .unwrap();
        let a = r
            .register(Some(root), "smith-001", BackingIno(11), None)
            .unwrap();
        let b = r
            .register(Some(root), "smith-002", BackingIno(12), None)
            .unwrap();
        let aa = r
            .register(Some(a), "smith-001", BackingIno(13), None)
            .unwrap();
        let ids = |v: Vec<SmithInfo>| v.into_iter().map(|s| s.idx).collect::<Vec<_>>();
        assert_eq!(ids(r.subtree(root)), vec![root, a, b, aa]);
        assert_eq!(ids(r.subtree(a)), vec![a, aa]);
        r.unregister(a);
        assert_eq!(ids(r.subtree(a)), Vec::new());
        assert_eq!(ids(r.subtree(root)), vec![root, b]);
    }
}
