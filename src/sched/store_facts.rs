//! Facts the scheduler reads from the backing store (never through the mount): a smith's newest
//! task, whether it has a result; and the one copy it makes,
//! `results/final.md` (PROTOCOL.md §5, §9).

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::SystemTime;

use crate::fs::backing::{self, SysResult};

fn is_reg(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFREG
}

/// The newest `task-*.md` directly in `<rel_dir>/inbox/` (a regular file whose name does not
/// start with `.`): its name and arrival time. The arrival time is the ctime, which a rename
/// into the inbox updates (the mtime of a task prepared elsewhere and moved in is older).
pub fn newest_task(root: BorrowedFd<'_>, rel_dir: &str) -> Option<(String, SystemTime)> {
    let inbox = backing::open_dir_path(root, &Path::new(rel_dir).join("inbox")).ok()?;
    let mut stream = backing::DirStream::open(inbox.as_fd()).ok()?;
    let mut best: Option<(SystemTime, String)> = None;
    while let Ok(Some(e)) = stream.next_entry() {
        let name = String::from_utf8_lossy(&e.name).into_owned();
        if !is_task_name(&name) {
            continue;
        }
        let Ok(c) = backing::component(OsStr::from_bytes(&e.name)) else {
            continue;
        };
        let Ok(st) = backing::stat_at(inbox.as_fd(), &c) else {
            continue;
        };
        if !is_reg(&st) {
            continue;
        }
        let t = ctime(&st);
        if best.as_ref().map_or(true, |b| (t, &name) > (b.0, &b.1)) {
            best = Some((t, name));
        }
    }
    best.map(|(t, n)| (n, t))
}

/// The arrival time of `<rel_dir>/inbox/<name>` (its ctime), if it is a regular file.
pub fn task_time(root: BorrowedFd<'_>, rel_dir: &str, name: &str) -> Option<SystemTime> {
    let inbox = backing::open_dir_path(root, &Path::new(rel_dir).join("inbox")).ok()?;
    let c = backing::component(OsStr::new(name)).ok()?;
    let st = backing::stat_at(inbox.as_fd(), &c).ok()?;
    is_reg(&st).then(|| ctime(&st))
}

/// Is `name` a task name per §5: `task-*.md`, not starting with `.`?
pub fn is_task_name(name: &str) -> bool {
    name.starts_with("task-") && name.ends_with(".md") && name.len() >= "task-.md".len()
}

fn ctime(st: &libc::stat) -> SystemTime {
    let secs = u64::try_from(st.st_ctime).unwrap_or(0);
    let nanos = u32::try_from(st.st_ctime_nsec).unwrap_or(0);
    SystemTime::UNIX_EPOCH + std::time::Duration::new(secs, nanos)
}

/// Does `<rel_dir>/outbox/result.md` exist as a regular file?
pub fn has_result(root: BorrowedFd<'_>, rel_dir: &str) -> bool {
    backing::open_dir_path(root, &Path::new(rel_dir).join("outbox"))
        .and_then(|o| backing::stat_at(o.as_fd(), c"result.md"))
        .is_ok_and(|st| is_reg(&st))
}

/// When `<rel_dir>/outbox/result.md` last changed (its ctime, like a task's arrival time), if
/// it is a regular file.
pub fn result_time(root: BorrowedFd<'_>, rel_dir: &str) -> Option<SystemTime> {
    backing::open_dir_path(root, &Path::new(rel_dir).join("outbox"))
        .and_then(|o| backing::stat_at(o.as_fd(), c"result.md"))
        .ok()
        .filter(is_reg)
        .map(|st| ctime(&st))
}

/// Copy `smiths/smith-root/outbox/result.md` to `results/final.md` atomically, unless
/// `final.md` already has that content. Returns the backing inode number of `results/` when it
/// wrote (for cache invalidation), `None` when nothing changed.
pub fn copy_final(root: BorrowedFd<'_>) -> SysResult<Option<u64>> {
    let result = backing::read_file(root, Path::new("smiths/smith-root/outbox/result.md"))?;
    let results = backing::ensure_dir(root, c"results", 0o755)?;
    if backing::read_file(results.as_fd(), Path::new("final.md")).is_ok_and(|f| f == result) {
        return Ok(None);
    }
    backing::write_atomic(results.as_fd(), c"final.md", &result, 0o644)?;
    Ok(Some(backing::stat(results.as_fd())?.st_ino))
}

#[cfg(test)]
mod tests {
    use super::is_task_name;

    #[test]
    fn task_names() {
        for (name, want) in [
            ("task-1.md", true),
            ("task-root.md", true),
            ("task-.md", true),
            (".task-1.md", false),
            ("task-1.md.swp", false),
            ("task-1.tmp", false),
            ("4913", false),
            ("result.md", false),
        ] {
            assert_eq!(is_task_name(name), want, "{name}");
        }
    }
}
