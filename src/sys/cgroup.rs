//! cgroup v2 primitives (Linux): where the caller's own cgroup is, a cgroup directory and the
//! few operations on it (create, move a process in, list, signal, kill, claim, remove), and the
//! names of a daemon's parent cgroup. The tree smithfs builds from them, and what it means, is
//! [`crate::identity::cgroup`]'s (docs/SPEC.md §2, cgroup mode) and [`crate::limits::cgroup`]'s.
//!
//! **Ownership.** The daemon holds an exclusive `flock` on its parent directory for its whole
//! life ([`Cgroup::claim`]); the kernel drops it when the daemon dies. A parent nobody holds
//! ([`claimed`] is false) is a dead daemon's. This is what start-up cleanup and leftover kills go
//! by, never the pid in the name: a daemon in another pid namespace (a container, `unshare -pf
//! --mount-proc`) cannot see the pids of the others, and its own pid may be any other's.

use std::ffi::OsStr;
use std::fs;
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::FlockOperation;

use super::procfs::{Cgroups, MountInfo};

/// Name of the cgroup of user hooks under the parent.
pub const OPERATOR_CGROUP: &str = "operator";

/// Name of a smith's leaf cgroup inside its node: where its own processes are.
pub const SELF_CGROUP: &str = "self";

/// The directory of the caller's own cgroup v2 cgroup, from its `mountinfo` and `cgroup` files
/// (pure). The first `cgroup2` mount whose root contains the process's v2 path wins.
///
/// `None`: no cgroup2 mount, no `0::` line, a path outside the mount (another cgroup namespace,
/// `/..`), or a deleted cgroup.
pub fn own_cgroup_dir(mounts: &[MountInfo], own: &Cgroups) -> Option<PathBuf> {
    let path = own.v2.as_ref()?;
    if own.v2_deleted || path.components().any(|c| c.as_os_str() == "..") {
        return None;
    }
    mounts
        .iter()
        .filter(|m| m.fs_type == "cgroup2")
        .find_map(|m| {
            let rel = path.strip_prefix(&m.root).ok()?;
            Some(m.mount_point.join(rel))
        })
}

/// A cgroup directory smithfs created: its path, an `O_DIRECTORY` descriptor (for
/// `clone3(CLONE_INTO_CGROUP)`), and its cgroup id.
#[derive(Debug)]
pub struct Cgroup {
    /// Absolute path under the cgroup2 mount.
    pub path: PathBuf,
    /// `O_RDONLY | O_DIRECTORY | O_CLOEXEC` descriptor of the directory.
    pub dir: OwnedFd,
    /// The cgroup id (inode number of the directory).
    pub id: u64,
}

impl Cgroup {
    /// Opens the existing cgroup directory `path`.
    ///
    /// # Errors
    /// `open`'s or `stat`'s error.
    pub fn open_existing(path: &Path) -> io::Result<Cgroup> {
        Cgroup::open(path)
    }

    /// Creates the directory `path` (its parent must exist) and opens it.
    ///
    /// # Errors
    /// `mkdir`'s error (`EEXIST`, `EACCES`, `EROFS`, `ENOENT` …), or opening/stat-ing it.
    pub fn create(path: &Path) -> io::Result<Cgroup> {
        fs::create_dir(path)?;
        match Cgroup::open(path) {
            Ok(c) => Ok(c),
            Err(e) => {
                let _ = fs::remove_dir(path);
                Err(e)
            }
        }
    }

    fn open(path: &Path) -> io::Result<Cgroup> {
        // std opens close-on-exec.
        let dir = OwnedFd::from(
            fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECTORY)
                .open(path)?,
        );
        let id = fs::metadata(path)?.ino();
        Ok(Cgroup {
            path: path.to_path_buf(),
            dir,
            id,
        })
    }

    fn write_file(&self, name: &str, text: &str) -> io::Result<()> {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .open(self.path.join(name))?;
        f.write_all(text.as_bytes())
    }

    /// Moves the thread group of `pid` (a tid is enough) into this cgroup (`cgroup.procs`).
    ///
    /// # Errors
    /// `ESRCH` no such process, `EACCES`/`EPERM`/`EBUSY` as the kernel decides.
    pub fn move_in(&self, pid: u32) -> io::Result<()> {
        self.write_file("cgroup.procs", &pid.to_string())
    }

    /// The processes in this cgroup now (`cgroup.procs`; pids in our namespace).
    ///
    /// # Errors
    /// Reading the file.
    pub fn procs(&self) -> io::Result<Vec<u32>> {
        let text = fs::read_to_string(self.path.join("cgroup.procs"))?;
        Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
    }

    /// True while any process is in this cgroup (`populated 1` in `cgroup.events`).
    ///
    /// # Errors
    /// Reading the file.
    pub fn populated(&self) -> io::Result<bool> {
        let text = fs::read_to_string(self.path.join("cgroup.events"))?;
        Ok(text.lines().any(|l| l.trim() == "populated 1"))
    }

    /// SIGKILL everything in the cgroup at once (`cgroup.kill`, Linux ≥ 5.14), forks included.
    /// Not for a cgroup that runs are still created in: Linux (6.18) then SIGKILLs every later
    /// `clone3(CLONE_INTO_CGROUP)` child at birth (see `identity::Resolver::kill_smith`).
    ///
    /// # Errors
    /// Writing the file (`ENOENT` on older kernels).
    pub fn kill_all(&self) -> io::Result<()> {
        self.write_file("cgroup.kill", "1")
    }

    /// Sends `signal` to every process of the cgroup: the cgroup is frozen first (so nothing forks
    /// past the list; waits at most `freeze_wait`), each process is signalled, then it is thawed
    /// (a frozen process receives the signal when thawed).
    ///
    /// # Errors
    /// Reading `cgroup.procs` or writing `cgroup.freeze`. Processes that vanished are skipped.
    pub fn signal_all(&self, signal: i32, freeze_wait: Duration) -> io::Result<()> {
        self.write_file("cgroup.freeze", "1")?;
        let deadline = Instant::now() + freeze_wait;
        while Instant::now() < deadline {
            match fs::read_to_string(self.path.join("cgroup.events")) {
                Ok(t) if t.lines().any(|l| l.trim() == "frozen 1") => break,
                Ok(_) => std::thread::sleep(Duration::from_millis(1)),
                Err(_) => break,
            }
        }
        let result = self.procs().map(|pids| {
            for pid in pids {
                if let Ok(pid) = libc::pid_t::try_from(pid) {
                    // SAFETY: kill takes two integers; the process is frozen in our cgroup, so
                    // its pid cannot be recycled before the signal is queued.
                    unsafe { libc::kill(pid, signal) };
                }
            }
        });
        let thawed = self.write_file("cgroup.freeze", "0");
        result.and(thawed)
    }

    /// Polls until the cgroup is empty or `timeout` passes; true if empty.
    pub fn wait_empty(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            match self.populated() {
                Ok(false) | Err(_) => return true,
                Ok(true) if Instant::now() >= deadline => return false,
                Ok(true) => std::thread::sleep(Duration::from_millis(2)),
            }
        }
    }

    /// Claims this cgroup for the calling process until its descriptor is closed (at the
    /// latest when the process dies): an exclusive, non-blocking `flock` on the directory.
    ///
    /// # Errors
    /// `EWOULDBLOCK` if a live process holds it already, or `flock`'s other errors.
    pub fn claim(&self) -> io::Result<()> {
        rustix::fs::flock(&self.dir, FlockOperation::NonBlockingLockExclusive)?;
        Ok(())
    }

    /// Removes the (empty) cgroup directory.
    ///
    /// # Errors
    /// `EBUSY` while processes or child cgroups are in it.
    pub fn remove(&self) -> io::Result<()> {
        match fs::remove_dir(&self.path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }
}

/// Is the cgroup directory `path` held by a live process through [`Cgroup::claim`]? `true` also
/// when that cannot be told (it cannot be opened, or `flock` fails otherwise): never taken for
/// a dead daemon's by mistake.
pub fn claimed(path: &Path) -> bool {
    let Ok(dir) = fs::File::open(path) else {
        return true;
    };
    // Released when `dir` is dropped below.
    rustix::fs::flock(&dir, FlockOperation::NonBlockingLockExclusive).is_err()
}

/// Is `name` a daemon's parent cgroup name: `smithfs-<pid>` or `smithfs-<pid>-<n>` (digits only)?
/// Other `smithfs-…` names (a test's cgroup, say) are never taken for a daemon's.
pub fn is_parent_name(name: &OsStr) -> bool {
    let Some(rest) = name.as_bytes().strip_prefix(b"smithfs-") else {
        return false;
    };
    let mut parts = rest.splitn(2, |b| *b == b'-');
    let digits = |p: &[u8]| !p.is_empty() && p.iter().all(u8::is_ascii_digit);
    parts.next().is_some_and(digits) && parts.next().map_or(true, digits)
}

/// Removes the directory tree `dir` bottom-up (cgroup directories: `rmdir` only; one that still
/// has processes stays, with its ancestors). Missing is fine.
pub fn remove_tree(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path());
            }
        }
    }
    let _ = fs::remove_dir(dir);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::procfs::{parse_cgroup, parse_mountinfo};

    #[test]
    fn parent_names() {
        for (name, want) in [
            ("smithfs-4242", true),
            ("smithfs-4242-2", true),
            ("smithfs-", false),
            ("smithfs-test-4242-7", false),
            ("smithfs-spawn-test-1", false),
            ("smithfs-42-x", false),
            ("smithfs-42-", false),
            ("smithfs-42-2-3", false),
            ("other-42", false),
        ] {
            assert_eq!(is_parent_name(OsStr::new(name)), want, "{name}");
        }
    }

    const MOUNTS: &[u8] = b"\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn own_cgroup_dir_table() {
        let mounts = parse_mountinfo(MOUNTS).expect("fixture");
        let delegated = parse_mountinfo(
            b"50 1 0:40 /user.slice /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n",
        )
        .expect("fixture");
        let rows: &[(&[MountInfo], &[u8], Option<&str>)] = &[
            (
                &mounts,
                b"4:memory:/x\n0::/\n",
                Some("/sys/fs/cgroup/unified/"),
            ),
            (
                &mounts,
                b"0::/system.slice/a b.service\n",
                Some("/sys/fs/cgroup/unified/system.slice/a b.service"),
            ),
            (&mounts, b"4:memory:/x\n", None),
            (&mounts, b"0::/gone (deleted)\n", None),
            (&mounts, b"0::/../../outside\n", None),
            (
                &delegated,
                b"0::/user.slice/u/app\n",
                Some("/sys/fs/cgroup/u/app"),
            ),
            (&delegated, b"0::/system.slice\n", None),
            (&[], b"0::/\n", None),
        ];
        for (i, (m, cg, want)) in rows.iter().enumerate() {
            let own = parse_cgroup(cg).expect("fixture");
            assert_eq!(own_cgroup_dir(m, &own), want.map(PathBuf::from), "row {i}");
        }
    }
}
