//! The cgroup backends of `limits.per_smith` / `limits.per_subtree` (docs/SPEC.md §5).
//!
//! Each controller a configured limit needs (`memory`, `pids`, `cpu`) is enforced where the host
//! has it:
//! - **v2**: in the unified hierarchy, if the daemon's cgroup lists it in `cgroup.controllers`
//!   and can delegate it (`+memory` into its `cgroup.subtree_control`: the root cgroup, or a
//!   cgroup whose controllers were delegated to us). The limits go straight into the identity
//!   tree of [`crate::identity::cgroup`] (`smithfs-<pid>/<full id>/` and its `self/` leaf).
//! - **v1**: else in that controller's v1 hierarchy (a hybrid host): the same tree is mirrored
//!   there, `<v1 mount><daemon's v1 path>/smithfs-<pid>/<full id>/self/`, and a run is placed
//!   in the v1 leaves by writing `cgroup.procs` before it executes anything (v1 has no
//!   `CLONE_INTO_CGROUP`).
//!
//! Nothing outside `smithfs-<pid>` is ever created or written, except `+controller` into the
//! daemon's own `cgroup.subtree_control` on v2.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::{CgroupLimits, CgroupPlan, Controller};
use crate::sys::cgroup::{claimed, is_parent_name, own_cgroup_dir, remove_tree, SELF_CGROUP};
use crate::sys::procfs::{self, Cgroups, MountInfo};

/// Where one controller is available to the daemon.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Place {
    /// The unified hierarchy, in the daemon's cgroup `base` (from `cgroup.controllers`).
    V2 {
        /// The daemon's cgroup directory.
        base: PathBuf,
    },
    /// A v1 hierarchy: the daemon's cgroup directory in it.
    V1 {
        /// `<mount point><the daemon's path in that hierarchy>`.
        base: PathBuf,
    },
}

/// What the host offers, per controller (`doctor`, and the mount's check).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Availability {
    /// Each available controller and where (v2 preferred over v1).
    pub controllers: BTreeMap<Controller, Place>,
    /// The daemon's cgroup in the unified hierarchy, if any.
    pub v2_base: Option<PathBuf>,
}

impl Availability {
    /// Which controllers are where, in one line for `doctor`: `v1 (memory, pids, cpu)`,
    /// `v2 (memory, pids, cpu)`, `v2 (memory), v1 (pids, cpu)`, or `none`.
    pub fn describe(&self) -> String {
        let mut v2 = Vec::new();
        let mut v1 = Vec::new();
        for (c, p) in &self.controllers {
            match p {
                Place::V2 { .. } => v2.push(c.as_str()),
                Place::V1 { .. } => v1.push(c.as_str()),
            }
        }
        let mut parts = Vec::new();
        if !v2.is_empty() {
            parts.push(format!("v2 ({})", v2.join(", ")));
        }
        if !v1.is_empty() {
            parts.push(format!("v1 ({})", v1.join(", ")));
        }
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join(", ")
        }
    }
}

/// Finds where each controller is (pure but for `read`, which reads a cgroup v2
/// `cgroup.controllers` file): v2 if the daemon's unified cgroup (from `own`'s `0::` line)
/// lists it, else the v1 hierarchy that has it bound (a `cgroup` mount whose options name it).
pub fn detect(
    mounts: &[MountInfo],
    own: &Cgroups,
    read: &dyn Fn(&Path) -> Option<String>,
) -> Availability {
    let mut out = Availability {
        v2_base: own_cgroup_dir(mounts, own),
        ..Availability::default()
    };
    let v2_listed: Vec<String> = out
        .v2_base
        .as_ref()
        .and_then(|b| read(&b.join("cgroup.controllers")))
        .map(|t| t.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default();
    for c in Controller::ALL {
        if let (Some(base), true) = (&out.v2_base, v2_listed.iter().any(|n| n == c.as_str())) {
            out.controllers.insert(c, Place::V2 { base: base.clone() });
            continue;
        }
        let Some(h) = own
            .v1
            .iter()
            .find(|h| h.controllers.iter().any(|n| n == c.as_str()))
        else {
            continue;
        };
        let Some(base) = mounts.iter().find_map(|m| {
            let bound =
                m.fs_type == "cgroup" && m.super_options.split(',').any(|o| o == c.as_str());
            if !bound || h.path.components().any(|p| p.as_os_str() == "..") {
                return None;
            }
            let rel = h.path.strip_prefix(&m.root).ok()?;
            Some(m.mount_point.join(rel))
        }) else {
            continue;
        };
        out.controllers.insert(c, Place::V1 { base });
    }
    out
}

/// [`detect`] for the calling process, from `/proc/self/{mountinfo,cgroup}`.
pub fn detect_here() -> Availability {
    let (Ok(m), Ok(c)) = (
        fs::read("/proc/self/mountinfo"),
        fs::read("/proc/self/cgroup"),
    ) else {
        return Availability::default();
    };
    let (Ok(m), Ok(c)) = (procfs::parse_mountinfo(&m), procfs::parse_cgroup(&c)) else {
        return Availability::default();
    };
    detect(&m, &c, &|p| fs::read_to_string(p).ok())
}

fn write(dir: &Path, file: &str, text: &str) -> io::Result<()> {
    let mut f = fs::OpenOptions::new().write(true).open(dir.join(file))?;
    f.write_all(text.as_bytes())
}

fn err_at(dir: &Path, file: &str, text: &str, e: io::Error) -> String {
    format!("writing {text:?} to {}: {e}", dir.join(file).display())
}

/// Writes `limits` of controller `c` into the cgroup directory `dir` of version `v2`. A limit
/// that is not set is left alone in a new cgroup (`clear` false: it is unlimited already) and
/// written as unlimited (`max`, `-1`) in an existing one (`clear` true: a reload lifted it).
fn apply(
    dir: &Path,
    v2: bool,
    c: Controller,
    limits: &CgroupLimits,
    clear: bool,
) -> Result<(), String> {
    let put =
        |file: &str, text: String| write(dir, file, &text).map_err(|e| err_at(dir, file, &text, e));
    match (c, v2) {
        (Controller::Memory, true) => match limits.memory_max {
            Some(m) => {
                put("memory.max", m.bytes().to_string())?;
                // No swap beyond the limit either, where swap accounting exists.
                let _ = write(dir, "memory.swap.max", "0");
            }
            None if clear => {
                put("memory.max", "max".into())?;
                let _ = write(dir, "memory.swap.max", "max");
            }
            None => {}
        },
        (Controller::Memory, false) => {
            let text = match limits.memory_max {
                Some(m) => m.bytes().to_string(),
                None if clear => "-1".into(),
                None => return Ok(()),
            };
            // v1 keeps memory.limit_in_bytes <= memory.memsw.limit_in_bytes: raising, memsw
            // goes first; lowering, it fails first and goes after (where swap is accounted).
            let _ = write(dir, "memory.memsw.limit_in_bytes", &text);
            put("memory.limit_in_bytes", text.clone())?;
            let _ = write(dir, "memory.memsw.limit_in_bytes", &text);
        }
        (Controller::Pids, _) => match limits.pids_max {
            Some(p) => put("pids.max", p.to_string())?,
            None if clear => put("pids.max", "max".into())?,
            None => {}
        },
        (Controller::Cpu, true) => match limits.cpu_max {
            Some(c) => put("cpu.max", c.v2_text())?,
            None if clear => put("cpu.max", "max".into())?,
            None => {}
        },
        (Controller::Cpu, false) => {
            let c = match limits.cpu_max {
                Some(c) => c,
                None if clear => super::CpuMax {
                    quota_us: None,
                    period_us: super::CpuMax::DEFAULT_PERIOD_US,
                },
                None => return Ok(()),
            };
            let q = c.quota_us.map_or("-1".to_string(), |q| q.to_string());
            if c.quota_us.is_some() {
                // A quota is checked against the period in force: lift it first.
                let _ = write(dir, "cpu.cfs_quota_us", "-1");
            }
            put("cpu.cfs_period_us", c.period_us.to_string())?;
            put("cpu.cfs_quota_us", q)?;
        }
    }
    Ok(())
}

/// The oom-kill counter of a memory cgroup: `oom_kill N` in `memory.events` (v2) or
/// `memory.oom_control` (v1, Linux ≥ 4.13). Counts the processes of the cgroup (and its
/// descendants: a leaf has none) that the OOM killer killed, whichever limit made it kill.
pub fn parse_oom_kill(text: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == "oom_kill").then(|| v.trim().parse().ok()).flatten()
    })
}

/// One v1 hierarchy used for limits.
#[derive(Debug)]
struct V1Tree {
    controller: Controller,
    /// `<base>/smithfs-<pid>`.
    parent: PathBuf,
}

/// The limits of one daemon, applied to the cgroups of its smiths (see the module header).
#[derive(Debug)]
pub struct LimitTree {
    plan: CgroupPlan,
    /// Controllers enforced in the unified hierarchy (in the identity tree itself).
    v2: Vec<Controller>,
    v1: Vec<V1Tree>,
}

/// Why configured limits cannot be enforced: one line naming what is missing (docs/SPEC.md §5).
pub fn unavailable(plan: &CgroupPlan, avail: &Availability) -> Option<String> {
    for c in plan.controllers() {
        if !avail.controllers.contains_key(&c) {
            return Some(format!(
                "{} cannot be enforced: no {} controller (not in the unified hierarchy's cgroup.controllers{}, and no cgroup v1 {} hierarchy)",
                plan.key_needing(c),
                c.as_str(),
                avail
                    .v2_base
                    .as_ref()
                    .map(|b| format!(" at {}", b.display()))
                    .unwrap_or_default(),
                c.as_str()
            ));
        }
    }
    None
}

impl LimitTree {
    /// Sets up the limits of `plan` for the daemon whose identity parent cgroup is `v2_parent`
    /// (`<v2 base>/smithfs-<pid>`, just created, empty): delegates the v2 controllers into it
    /// and creates the v1 parents of the same name (removing stale ones of dead daemons first,
    /// see [`sweep_v1`]).
    ///
    /// # Errors
    /// One line naming what is missing: a controller the host lacks, or one the daemon's cgroup
    /// cannot delegate (v2: its `cgroup.subtree_control` refuses, e.g. `EBUSY` because it holds
    /// processes and is not the root cgroup), or a v1 directory that cannot be made.
    pub fn setup(
        plan: CgroupPlan,
        v2_parent: &Path,
        avail: &Availability,
    ) -> Result<LimitTree, String> {
        let empty = LimitTree {
            plan,
            v2: Vec::new(),
            v1: Vec::new(),
        };
        empty.widened(plan, v2_parent, avail)
    }

    /// The controllers this tree enforces, v2 ones first.
    pub fn controllers(&self) -> Vec<Controller> {
        let mut out = self.v2.clone();
        out.extend(self.v1.iter().map(|t| t.controller));
        out
    }

    /// A tree with `plan` (a reload) that enforces the controllers of this one and those `plan`
    /// needs in addition, set up as [`LimitTree::setup`] sets them up (the daemon's identity
    /// parent cgroup is `v2_parent`). A controller a reload no longer needs stays in the tree:
    /// its limits are written as unlimited ([`LimitTree::reapply`]).
    ///
    /// # Errors
    /// As [`LimitTree::setup`]; only the v1 parents made by this call are removed then.
    pub fn widened(
        &self,
        plan: CgroupPlan,
        v2_parent: &Path,
        avail: &Availability,
    ) -> Result<LimitTree, String> {
        let have = self.controllers();
        if plan.controllers().iter().any(|c| !have.contains(c)) {
            if let Some(e) = unavailable(&plan, avail) {
                return Err(e);
            }
        }
        let name = v2_parent
            .file_name()
            .ok_or_else(|| format!("{}: no parent name", v2_parent.display()))?;
        let v2_base = v2_parent.parent().unwrap_or(Path::new("/"));
        let mut tree = LimitTree {
            plan,
            v2: self.v2.clone(),
            v1: self
                .v1
                .iter()
                .map(|t| V1Tree {
                    controller: t.controller,
                    parent: t.parent.clone(),
                })
                .collect(),
        };
        let mut made: Vec<PathBuf> = Vec::new();
        for c in plan.controllers() {
            if have.contains(&c) {
                continue;
            }
            match avail.controllers.get(&c) {
                Some(Place::V2 { .. }) => {
                    let text = format!("+{}", c.as_str());
                    for dir in [v2_base, v2_parent] {
                        let enabled = fs::read_to_string(dir.join("cgroup.subtree_control"))
                            .is_ok_and(|t| t.split_whitespace().any(|n| n == c.as_str()));
                        if !enabled {
                            write(dir, "cgroup.subtree_control", &text).map_err(|e| {
                                made.iter().for_each(|p| remove_tree(p));
                                format!(
                                    "{} cannot be enforced: the daemon's cgroup {} cannot delegate the {} controller ({}: {e}); run the daemon as root in the root cgroup or in a delegated scope (systemd-run --scope -p Delegate=yes) of its own",
                                    plan.key_needing(c),
                                    v2_base.display(),
                                    c.as_str(),
                                    dir.join("cgroup.subtree_control").display()
                                )
                            })?;
                        }
                    }
                    tree.v2.push(c);
                }
                Some(Place::V1 { base }) => {
                    sweep_v1(base, v2_base);
                    let parent = base.join(name);
                    match fs::create_dir(&parent) {
                        Ok(()) => made.push(parent.clone()),
                        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                        Err(e) => {
                            made.iter().for_each(|p| remove_tree(p));
                            return Err(format!(
                                "{} cannot be enforced: cannot create the cgroup v1 {} directory {}: {e}",
                                plan.key_needing(c),
                                c.as_str(),
                                parent.display()
                            ));
                        }
                    }
                    tree.v1.push(V1Tree {
                        controller: c,
                        parent,
                    });
                }
                None => {}
            }
        }
        Ok(tree)
    }

    /// Writes this tree's plan into the cgroups of every existing smith (a reload), `smiths`
    /// listed top-down (parents before children) as (full id, v2 `self/` leaf): each node gets
    /// the subtree limits, each leaf the per-smith ones, a limit no longer set is written as
    /// unlimited, a v2 controller new to the tree is enabled in every node first, and a v1
    /// hierarchy new to the tree gets the smith's directories and the processes of its leaf
    /// (so runs that are live already are bound too).
    ///
    /// Two passes: top-down with errors ignored, then bottom-up with errors counted, so that
    /// limits a hierarchy checks against the parent's (v1 `cpu`: a child's quota may not pass
    /// its parent's) can be both raised and lowered.
    ///
    /// # Errors
    /// The first write of the second pass that failed (e.g. v1 `memory.limit_in_bytes` below
    /// what the cgroup uses: `EBUSY`), in one line.
    pub fn reapply(&self, smiths: &[(PathBuf, PathBuf)]) -> Result<(), String> {
        let write_node = |rel: &Path, v2_leaf: &Path, strict: bool| -> Result<(), String> {
            let keep = |r: Result<(), String>| if strict { r } else { Ok(()) };
            if let Some(node) = v2_leaf.parent() {
                for c in &self.v2 {
                    if !strict {
                        let text = format!("+{}", c.as_str());
                        let _ = write(node, "cgroup.subtree_control", &text);
                    }
                    keep(apply(node, true, *c, &self.plan.per_subtree, true))?;
                }
            }
            for t in &self.v1 {
                let node = t.parent.join(rel);
                if !strict {
                    let _ = fs::create_dir_all(&node);
                }
                keep(apply(
                    &node,
                    false,
                    t.controller,
                    &self.plan.per_subtree,
                    true,
                ))?;
            }
            Ok(())
        };
        let write_leaf = |rel: &Path, v2_leaf: &Path, strict: bool| -> Result<(), String> {
            let keep = |r: Result<(), String>| if strict { r } else { Ok(()) };
            for c in &self.v2 {
                keep(apply(v2_leaf, true, *c, &self.plan.per_smith, true))?;
            }
            for t in &self.v1 {
                let leaf = t.parent.join(rel).join(SELF_CGROUP);
                if !strict {
                    let _ = fs::create_dir(&leaf);
                }
                keep(apply(
                    &leaf,
                    false,
                    t.controller,
                    &self.plan.per_smith,
                    true,
                ))?;
                if !strict {
                    // Processes already running in the smith's leaf join the v1 one (a
                    // pid already there is a no-op, one that exited meanwhile ESRCH).
                    let procs =
                        fs::read_to_string(v2_leaf.join("cgroup.procs")).unwrap_or_default();
                    for pid in procs.split_whitespace() {
                        let _ = write(&leaf, "cgroup.procs", pid);
                    }
                }
            }
            Ok(())
        };
        for (rel, leaf) in smiths {
            write_node(rel, leaf, false)?;
            write_leaf(rel, leaf, false)?;
        }
        for (rel, leaf) in smiths.iter().rev() {
            write_leaf(rel, leaf, true)?;
            write_node(rel, leaf, true)?;
        }
        Ok(())
    }

    /// The plan in force.
    pub fn plan(&self) -> &CgroupPlan {
        &self.plan
    }

    /// One line for the log: `memory on v1, pids on v1, cpu on v2`.
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = self
            .v2
            .iter()
            .map(|c| format!("{} on v2", c.as_str()))
            .collect();
        parts.extend(
            self.v1
                .iter()
                .map(|t| format!("{} on v1", t.controller.as_str())),
        );
        parts.join(", ")
    }

    /// A smith's node was created at `v2_node` (`<v2 parent>/<full id>`, `rel` = the full id):
    /// enables the v2 controllers for its children and writes the subtree limits; on v1, creates
    /// the node (and missing ancestors) and writes them there.
    ///
    /// # Errors
    /// The file or directory that could not be written, in one line.
    pub fn node_created(&self, v2_node: &Path, rel: &Path) -> Result<(), String> {
        for c in &self.v2 {
            let text = format!("+{}", c.as_str());
            write(v2_node, "cgroup.subtree_control", &text)
                .map_err(|e| err_at(v2_node, "cgroup.subtree_control", &text, e))?;
            apply(v2_node, true, *c, &self.plan.per_subtree, false)?;
        }
        for t in &self.v1 {
            let node = t.parent.join(rel);
            match fs::create_dir_all(&node) {
                Ok(()) => {}
                Err(e) => return Err(format!("mkdir {}: {e}", node.display())),
            }
            apply(&node, false, t.controller, &self.plan.per_subtree, false)?;
        }
        Ok(())
    }

    /// A smith's `self/` leaf was created at `v2_leaf` (`rel` = its full id): writes the
    /// per-smith limits there; on v1 creates `<full id>/self` and writes them there.
    ///
    /// # Errors
    /// As [`LimitTree::node_created`].
    pub fn leaf_created(&self, v2_leaf: &Path, rel: &Path) -> Result<(), String> {
        for c in &self.v2 {
            apply(v2_leaf, true, *c, &self.plan.per_smith, false)?;
        }
        for t in &self.v1 {
            let leaf = t.parent.join(rel).join(SELF_CGROUP);
            match fs::create_dir(&leaf) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(format!("mkdir {}: {e}", leaf.display())),
            }
            apply(&leaf, false, t.controller, &self.plan.per_smith, false)?;
        }
        Ok(())
    }

    /// True if runs must be placed by [`LimitTree::place`] before they execute (some limit is
    /// on a v1 hierarchy).
    pub fn needs_placing(&self) -> bool {
        !self.v1.is_empty()
    }

    /// Places the thread group of `pid` into the v1 `self/` leaves of the smith `rel` (the
    /// v2 leaf is the identity's business): `cgroup.procs`, before the process executes
    /// anything.
    ///
    /// # Errors
    /// The write that failed (`ESRCH` gone, `ENOENT` no such cgroup).
    pub fn place(&self, rel: &Path, pid: u32) -> io::Result<()> {
        for t in &self.v1 {
            let leaf = t.parent.join(rel).join(SELF_CGROUP);
            write(&leaf, "cgroup.procs", &pid.to_string()).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("moving {pid} into {}: {e}", leaf.display()),
                )
            })?;
        }
        Ok(())
    }

    /// The oom-kill counter of smith `rel`'s leaf (`None`: no memory limit, or unreadable).
    pub fn oom_kills(&self, v2_leaf: &Path, rel: &Path) -> Option<u64> {
        if self.v2.contains(&Controller::Memory) {
            return fs::read_to_string(v2_leaf.join("memory.events"))
                .ok()
                .as_deref()
                .and_then(parse_oom_kill);
        }
        let t = self
            .v1
            .iter()
            .find(|t| t.controller == Controller::Memory)?;
        let leaf = t.parent.join(rel).join(SELF_CGROUP);
        fs::read_to_string(leaf.join("memory.oom_control"))
            .ok()
            .as_deref()
            .and_then(parse_oom_kill)
    }

    /// The v1 `self/` leaf directories of smith `rel` (for tests and `meta.json`).
    pub fn v1_leaves(&self, rel: &Path) -> Vec<PathBuf> {
        self.v1
            .iter()
            .map(|t| t.parent.join(rel).join(SELF_CGROUP))
            .collect()
    }

    /// Smith `rel` was removed: removes its v1 leaf and node (and a node that still has
    /// children or processes stays until [`LimitTree::shutdown`]).
    pub fn removed(&self, rel: &Path) {
        for t in &self.v1 {
            let node = t.parent.join(rel);
            let _ = fs::remove_dir(node.join(SELF_CGROUP));
            let _ = fs::remove_dir(&node);
        }
    }

    /// Removes the v1 trees (the processes are the identity tree's, killed there).
    pub fn shutdown(&self) {
        for t in &self.v1 {
            remove_tree(&t.parent);
        }
    }
}

/// Removes the v1 `smithfs-*` trees under `v1_base` whose daemon is dead: the v2 parent of the
/// same name under `v2_base` is gone or claimed by nobody ([`claimed`]).
/// Only what `rmdir` accepts goes.
pub fn sweep_v1(v1_base: &Path, v2_base: &Path) {
    let Ok(entries) = fs::read_dir(v1_base) else {
        return;
    };
    for e in entries.flatten() {
        if !is_parent_name(&e.file_name()) {
            continue;
        }
        let twin = v2_base.join(e.file_name());
        if !twin.exists() || !claimed(&twin) {
            remove_tree(&e.path());
        }
    }
}

/// Removes the v1 mirrors named `name` (a dead daemon's `smithfs-<pid>`) in every v1
/// hierarchy of the calling process's limit controllers.
pub fn remove_v1_mirrors(name: &std::ffi::OsStr) {
    for p in detect_here().controllers.values() {
        if let Place::V1 { base } = p {
            remove_tree(&base.join(name));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::procfs::{parse_cgroup, parse_mountinfo};

    const HYBRID: &[u8] = b"\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const HYBRID_OWN: &[u8] = b"8:pids:/\n4:memory:/process_api/abc\n1:cpu:/\n0::/\n";

    const PURE_V2: &[u8] = b"50 1 0:40 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";

    #[test]
    fn detection_table() {
        let hybrid = parse_mountinfo(HYBRID).expect("fixture");
        let own = parse_cgroup(HYBRID_OWN).expect("fixture");
        let a = detect(&hybrid, &own, &|_| Some("hugetlb\n".into()));
        assert_eq!(
            a.controllers.get(&Controller::Memory),
            Some(&Place::V1 {
                base: "/sys/fs/cgroup/memory/process_api/abc".into()
            })
        );
        assert_eq!(
            a.controllers.get(&Controller::Cpu),
            Some(&Place::V1 {
                base: "/sys/fs/cgroup/cpu/".into()
            })
        );
        assert_eq!(a.describe(), "v1 (memory, pids, cpu)");
        // A unified hierarchy that has memory wins for memory only.
        let a = detect(&hybrid, &own, &|_| Some("memory hugetlb".into()));
        assert_eq!(a.describe(), "v2 (memory), v1 (pids, cpu)");

        let v2 = parse_mountinfo(PURE_V2).expect("fixture");
        let own = parse_cgroup(b"0::/system.slice/x.service\n").expect("fixture");
        let a = detect(&v2, &own, &|p| {
            assert_eq!(
                p,
                Path::new("/sys/fs/cgroup/system.slice/x.service/cgroup.controllers")
            );
            Some("cpuset cpu io memory pids".into())
        });
        assert_eq!(a.describe(), "v2 (memory, pids, cpu)");
        let a = detect(&v2, &own, &|_| Some("cpu".into()));
        assert_eq!(a.describe(), "v2 (cpu)");
        let (plan, _) = CgroupPlan::new(
            CgroupLimits {
                pids_max: Some(3),
                ..CgroupLimits::default()
            },
            CgroupLimits::default(),
        );
        let why = unavailable(&plan, &a).expect("no pids");
        assert!(
            why.starts_with("limits.per_smith.pids_max cannot be enforced: no pids controller"),
            "{why}"
        );
        assert_eq!(detect(&[], &own, &|_| None).describe(), "none");
    }

    #[test]
    fn oom_kill_counters() {
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        let v2 = "low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(parse_oom_kill(v1), Some(3));
        assert_eq!(parse_oom_kill(v2), Some(2));
        assert_eq!(parse_oom_kill("oom 1\n"), None);
    }
}
