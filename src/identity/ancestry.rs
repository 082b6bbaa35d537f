//! The ancestry walk of docs/SPEC.md §2, as pure logic over an abstract "parent of" function, plus a
//! `/proc`-text source of process nodes (used by tests, and where pidfds cannot answer).
//!
//! The walk starts at a thread group and climbs parents. At each process `classify` may stop it (a
//! bound process → its identity, the daemon → Unknown, a cached live process → its identity); pid 1
//! or a process whose parent is invisible (ppid 0: outside our pid namespace, or a kernel thread)
//! ends it as Operator. A process is named by a `key` that no other process ever has (a pidfs inode
//! number, or the pair pid + start time), never by its pid alone.

use super::Identity;
use crate::sys::procfs::{parse_stat, parse_status, ParseError};

/// Longest chain of parents the walk climbs before giving up (fail closed: Unknown). Real chains
/// are far shorter; a longer one means the process table changed under the walk.
pub const MAX_DEPTH: usize = 1024;

/// One process as the walk sees it.
pub trait ProcNode {
    /// Its pid in the resolver's pid namespace (> 0).
    fn pid(&self) -> u32;
    /// Its parent's pid there; 0 if the parent is not visible (outside the namespace, or none).
    fn ppid(&self) -> u32;
}

/// A process read from `/proc`: pid, parent and start time (clock ticks after boot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StatNode {
    /// pid (the thread group id).
    pub pid: u32,
    /// Parent's pid (0 if invisible).
    pub ppid: u32,
    /// Start time in clock ticks; with `pid` it names one process across pid reuse.
    pub starttime: u64,
}

impl ProcNode for StatNode {
    fn pid(&self) -> u32 {
        self.pid
    }
    fn ppid(&self) -> u32 {
        self.ppid
    }
}

/// Climbs from `start` (the caller's thread group) through `parent_of` until `classify` answers,
/// pid 1 or an invisible parent is met (→ Operator), or [`MAX_DEPTH`] is exceeded (→ Unknown).
///
/// `classify` is asked about `start` first, then each ancestor in order. `parent_of(n)` returns
/// the current parent of `n` (implementations must re-check that `n`'s parent did not change
/// while it was being read, so that a recycled pid is never taken for the parent).
///
/// # Errors
/// The first error of `parent_of` (typically: the process vanished mid-walk).
pub fn walk<N: ProcNode, E>(
    start: N,
    mut parent_of: impl FnMut(&N) -> Result<N, E>,
    mut classify: impl FnMut(&N) -> Option<Identity>,
) -> Result<Identity, E> {
    let mut node = start;
    for _ in 0..MAX_DEPTH {
        if let Some(identity) = classify(&node) {
            return Ok(identity);
        }
        if node.pid() == 1 || node.ppid() == 0 {
            return Ok(Identity::Operator);
        }
        node = parent_of(&node)?;
    }
    Ok(Identity::Unknown)
}

/// Why a `/proc` node could not be read.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The file could not be read (the process is gone: `ENOENT`/`ESRCH`).
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The file did not parse.
    #[error(transparent)]
    Parse(#[from] ParseError),
    /// A pid that is not a positive number.
    #[error("negative or zero pid {0}")]
    BadPid(i32),
    /// The parent changed while it was read (a re-parent or a recycled pid): try again.
    #[error("process {0} changed parent during the walk")]
    Raced(u32),
}

fn positive(v: i32) -> Result<u32, NodeError> {
    u32::try_from(v).map_err(|_| NodeError::BadPid(v))
}

fn nonneg(v: i32) -> Result<u32, NodeError> {
    if v < 0 {
        Err(NodeError::BadPid(v))
    } else {
        Ok(v.unsigned_abs())
    }
}

/// Reads `/proc` through `read` (a path → bytes function, so tests can feed fixtures).
pub struct ProcfsSource<R> {
    read: R,
}

impl<R: FnMut(&str) -> std::io::Result<Vec<u8>>> ProcfsSource<R> {
    /// A source reading files with `read` (the real one is `|p| std::fs::read(p)`).
    pub fn new(read: R) -> Self {
        ProcfsSource { read }
    }

    fn file(&mut self, path: String) -> Result<Vec<u8>, NodeError> {
        (self.read)(&path).map_err(|source| NodeError::Read { path, source })
    }

    /// The process `pid` from `/proc/<pid>/stat`.
    ///
    /// # Errors
    /// [`NodeError::Read`] if it is gone, [`NodeError::Parse`] for a malformed file.
    pub fn process(&mut self, pid: u32) -> Result<StatNode, NodeError> {
        let stat = parse_stat(&self.file(format!("/proc/{pid}/stat"))?)?;
        Ok(StatNode {
            pid: positive(stat.pid)?,
            ppid: nonneg(stat.ppid)?,
            starttime: stat.starttime,
        })
    }

    /// The thread group of thread `tid`, from `/proc/<tid>/status` (`Tgid:`) then the group's
    /// `stat`.
    ///
    /// # Errors
    /// As [`ProcfsSource::process`].
    pub fn thread_group(&mut self, tid: u32) -> Result<StatNode, NodeError> {
        let status = parse_status(&self.file(format!("/proc/{tid}/status"))?)?;
        self.process(positive(status.tgid)?)
    }

    /// The parent of `child`, checked: after reading the parent, `child` is read again and must
    /// still have the same start time and parent, else [`NodeError::Raced`].
    ///
    /// # Errors
    /// As [`ProcfsSource::process`], and [`NodeError::Raced`].
    pub fn parent_of(&mut self, child: &StatNode) -> Result<StatNode, NodeError> {
        let parent = self.process(child.ppid)?;
        let again = self.process(child.pid)?;
        if again.starttime != child.starttime || again.ppid != child.ppid {
            return Err(NodeError::Raced(child.pid));
        }
        Ok(parent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::model::SmithIdx;
    use std::collections::HashMap;

    /// A fake process table: pid → (ppid, start time).
    fn table(rows: &[(u32, u32, u64)]) -> HashMap<u32, StatNode> {
        rows.iter()
            .map(|&(pid, ppid, starttime)| {
                (
                    pid,
                    StatNode {
                        pid,
                        ppid,
                        starttime,
                    },
                )
            })
            .collect()
    }

    const DAEMON: (u32, u64) = (500, 50);
    const SMITH: Identity = Identity::Smith(SmithIdx(7));

    /// Classifies as the resolver does: bound (pid, start) pairs, then the daemon.
    fn run(procs: &HashMap<u32, StatNode>, bound: &[(u32, u64)], start: u32) -> Identity {
        let parent_of = |n: &StatNode| procs.get(&n.ppid).copied().ok_or("gone");
        let classify = |n: &StatNode| {
            if bound.contains(&(n.pid, n.starttime)) {
                Some(SMITH)
            } else if (n.pid, n.starttime) == DAEMON {
                Some(Identity::Unknown)
            } else {
                None
            }
        };
        walk(procs[&start], parent_of, classify).unwrap_or(Identity::Unknown)
    }

    #[test]
    fn walk_table() {
        // init 1 → shell 100 → keeper 200 (bound at start 20) → cmd 201 → grandchild 202
        //        → daemon 500 → run 600 (bound) → 601;  daemon → hook 700 (unbound) → 701
        //        → 300 (pid reused: bound entry says 300@30 but this 300 started at 31)
        // container: 800 with ppid 0 (its parent is outside our namespace)
        let procs = table(&[
            (1, 0, 1),
            (100, 1, 10),
            (200, 100, 20),
            (201, 200, 21),
            (202, 201, 22),
            (500, 1, 50),
            (600, 500, 60),
            (601, 600, 61),
            (700, 500, 70),
            (701, 700, 71),
            (300, 100, 31),
            (301, 300, 32),
            (800, 0, 80),
        ]);
        let bound = [(200, 20), (600, 60), (300, 30)];
        let rows: &[(u32, Identity, &str)] = &[
            (200, SMITH, "the bound process itself"),
            (201, SMITH, "its child"),
            (202, SMITH, "its grandchild"),
            (601, SMITH, "a run under the daemon"),
            (600, SMITH, "the run itself"),
            (700, Identity::Unknown, "unbound child of the daemon"),
            (701, Identity::Unknown, "unbound grandchild of the daemon"),
            (500, Identity::Unknown, "the daemon itself"),
            (100, Identity::Operator, "the operator's shell"),
            (1, Identity::Operator, "init"),
            (300, Identity::Operator, "recycled pid of a bound process"),
            (301, Identity::Operator, "child of a recycled pid"),
            (800, Identity::Operator, "parent invisible"),
        ];
        for &(pid, want, why) in rows {
            assert_eq!(run(&procs, &bound, pid), want, "{why} (pid {pid})");
        }
    }

    #[test]
    fn a_cycle_fails_closed() {
        let procs = table(&[(10, 11, 1), (11, 10, 1)]);
        assert_eq!(run(&procs, &[], 10), Identity::Unknown);
    }

    #[test]
    fn a_vanished_parent_is_an_error() {
        let procs = table(&[(10, 9, 1)]);
        let r = walk(
            procs[&10],
            |n: &StatNode| procs.get(&n.ppid).copied().ok_or("gone"),
            |_| None,
        );
        assert_eq!(r, Err("gone"));
    }

    /// `/proc/<pid>/stat` text for a fixture, with 52 fields like a real 6.x kernel.
    fn stat_line(pid: u32, comm: &str, ppid: u32, start: u64) -> Vec<u8> {
        let mut fields = vec!["0".to_string(); 49];
        fields[0] = "S".into();
        fields[1] = ppid.to_string();
        fields[2] = pid.to_string();
        fields[3] = pid.to_string();
        fields[19] = start.to_string();
        format!("{pid} ({comm}) {}\n", fields.join(" ")).into_bytes()
    }

    fn status_text(tgid: u32, ppid: u32) -> Vec<u8> {
        format!(
            "Name:\tx\nTgid:\t{tgid}\nPid:\t{tgid}\nPPid:\t{ppid}\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nGroups:\t\n"
        )
        .into_bytes()
    }

    #[test]
    fn procfs_source_on_fixtures() {
        // comm with spaces and `)` — the parser must take the last `)`.
        let files: HashMap<String, Vec<u8>> = [
            ("/proc/1/stat", stat_line(1, "init", 0, 1)),
            ("/proc/42/stat", stat_line(42, "my (evil) cmd) 7 9", 1, 400)),
            ("/proc/43/stat", stat_line(43, ") ) )", 42, 401)),
            ("/proc/44/status", status_text(43, 42)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let read = |p: &str| {
            files
                .get(p)
                .cloned()
                .ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENOENT))
        };
        let mut src = ProcfsSource::new(read);
        let n43 = src.thread_group(44).expect("thread 44 of group 43");
        assert_eq!(
            n43,
            StatNode {
                pid: 43,
                ppid: 42,
                starttime: 401
            }
        );
        let n42 = src.parent_of(&n43).expect("parent");
        assert_eq!((n42.pid, n42.ppid, n42.starttime), (42, 1, 400));
        let bound = (42u32, 400u64);
        let id = walk(
            n43,
            |n| src.parent_of(n),
            |n| ((n.pid, n.starttime) == bound).then_some(SMITH),
        )
        .expect("walk");
        assert_eq!(id, SMITH);
        assert!(matches!(
            ProcfsSource::new(read).process(99),
            Err(NodeError::Read { .. })
        ));
    }

    #[test]
    fn procfs_parent_race_is_detected() {
        // The child's start time differs on the second read: its pid was recycled mid-walk.
        let mut reads = 0;
        let read = |p: &str| {
            reads += 1;
            Ok(match (p, reads) {
                ("/proc/5/stat", _) => stat_line(5, "p", 1, 50),
                ("/proc/6/stat", _) => stat_line(6, "c", 5, 99),
                _ => return Err(std::io::Error::from_raw_os_error(libc::ENOENT)),
            })
        };
        let mut src = ProcfsSource::new(read);
        let stale = StatNode {
            pid: 6,
            ppid: 5,
            starttime: 60,
        };
        assert!(matches!(src.parent_of(&stale), Err(NodeError::Raced(6))));
    }

    #[test]
    fn procfs_source_on_this_process() {
        let mut src = ProcfsSource::new(|p: &str| std::fs::read(p));
        let me = src.process(std::process::id()).expect("own stat");
        assert_eq!(me.pid, std::process::id());
        // Walk to init with no stops: the operator.
        let id = walk(me, |n| src.parent_of(n), |_| None).expect("walk");
        assert_eq!(id, Identity::Operator);
    }
}
