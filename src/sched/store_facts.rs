//! Facts the scheduler reads from the backing store (never through the mount): a smith's newest
//! task, whether it has a result; and the one copy it makes,
//! `results/final.md` (docs/SPEC.md §5, §9).

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::SystemTime;

use crate::backing;
use crate::tree::layout::is_task_name;

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
        if !is_task_name(&e.name) {
            continue;
        }
        let name = String::from_utf8_lossy(&e.name).into_owned();
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

fn ctime(st: &libc::stat) -> SystemTime {
    let secs = u64::try_from(st.st_ctime).unwrap_or(0);
    let nanos = u32::try_from(st.st_ctime_nsec).unwrap_or(0);
    SystemTime::UNIX_EPOCH + std::time::Duration::new(secs, nanos)
}

/// `lstat` of `<rel_dir>/outbox/result.md`, when it exists.
fn result_stat(root: BorrowedFd<'_>, rel_dir: &str) -> Option<libc::stat> {
    backing::open_dir_path(root, &Path::new(rel_dir).join("outbox"))
        .and_then(|o| backing::stat_at(o.as_fd(), c"result.md"))
        .ok()
}

/// What `<rel_dir>/outbox/result.md` is (docs/SPEC.md §5: only a regular file is a result).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResultFile {
    /// No such name.
    Absent,
    /// A regular file: the smith's result.
    Regular,
    /// Something else, named for a sentence (`"a symlink"`, `"a directory"`, `"a FIFO"`, …).
    Other(&'static str),
}

/// What `<rel_dir>/outbox/result.md` is, by one `lstat`.
pub fn result_file(root: BorrowedFd<'_>, rel_dir: &str) -> ResultFile {
    let Some(st) = result_stat(root, rel_dir) else {
        return ResultFile::Absent;
    };
    match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => ResultFile::Regular,
        libc::S_IFLNK => ResultFile::Other("a symlink"),
        libc::S_IFDIR => ResultFile::Other("a directory"),
        libc::S_IFIFO => ResultFile::Other("a FIFO"),
        libc::S_IFSOCK => ResultFile::Other("a socket"),
        _ => ResultFile::Other("a device node"),
    }
}

/// Does `<rel_dir>/outbox/result.md` exist as a regular file?
pub fn has_result(root: BorrowedFd<'_>, rel_dir: &str) -> bool {
    result_stat(root, rel_dir).is_some_and(|st| is_reg(&st))
}

/// When `<rel_dir>/outbox/result.md` last changed (its ctime, like a task's arrival time), if
/// it is a regular file.
pub fn result_time(root: BorrowedFd<'_>, rel_dir: &str) -> Option<SystemTime> {
    result_stat(root, rel_dir)
        .filter(is_reg)
        .map(|st| ctime(&st))
}

/// Why the root's result could not be copied to `results/final.md`; logged.
#[derive(Debug, thiserror::Error)]
pub enum CopyFinalError {
    /// A system call on the store failed.
    #[error("{0}")]
    Backing(#[from] nix::errno::Errno),
    /// `outbox/result.md` is not a regular file (a FIFO, a device …): not copied.
    #[error("outbox/result.md is not a regular file")]
    NotRegular,
}

/// Which file, and which version of it: what [`copy_final`] remembers of the result and of
/// `results/final.md` after a copy, so that the same pair again costs one `fstat` each, not a
/// read of both (notes H20).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fingerprint {
    dev: u64,
    ino: u64,
    size: i64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Fingerprint {
    fn of(st: &libc::stat) -> Fingerprint {
        Fingerprint {
            dev: st.st_dev,
            ino: st.st_ino,
            size: st.st_size,
            mtime: (st.st_mtime, st.st_mtime_nsec),
            ctime: (st.st_ctime, st.st_ctime_nsec),
        }
    }
}

/// Copy `smiths/smith-root/outbox/result.md` to `results/final.md` atomically, unless
/// `final.md` already has that content. Returns what it wrote ([`FinalCopied`], for cache
/// invalidation), `None` when nothing changed.
///
/// `last` is what the previous call left: when the result and `final.md` are still those files
/// unchanged (inode, size, mtime, ctime), nothing is read; it is updated after every copy or
/// comparison.
///
/// The copy streams and keeps holes ([`backing::copy_atomic`], docs/SPEC.md §9): a sparse result
/// costs the daemon no memory and the store only its data.
///
/// # Errors
/// [`CopyFinalError::NotRegular`], or the failed system call.
pub fn copy_final(
    root: BorrowedFd<'_>,
    last: &mut Option<(Fingerprint, Fingerprint)>,
) -> Result<Option<FinalCopied>, CopyFinalError> {
    let outbox = backing::open_dir_path(root, Path::new("smiths/smith-root/outbox"))?;
    // O_NONBLOCK: a FIFO named result.md must not hang the scheduler.
    let result = backing::open_file(
        outbox.as_fd(),
        c"result.md",
        libc::O_RDONLY | libc::O_NONBLOCK,
        0,
    )?;
    let result_st = backing::stat(result.as_fd())?;
    if !is_reg(&result_st) {
        return Err(CopyFinalError::NotRegular);
    }
    let (results, results_made) = backing::ensure_dir_made(root, c"results", 0o755)?;
    let final_file = backing::open_file(
        results.as_fd(),
        c"final.md",
        libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOFOLLOW,
        0,
    )
    .ok()
    .and_then(|f| {
        let st = backing::stat(f.as_fd()).ok()?;
        is_reg(&st).then_some((f, st))
    });
    let now = final_file
        .as_ref()
        .map(|(_, st)| (Fingerprint::of(&result_st), Fingerprint::of(st)));
    if !results_made && now.is_some() && now == *last {
        return Ok(None);
    }
    let same = final_file
        .as_ref()
        .map(|(f, _)| backing::same_content(result.as_fd(), f.as_fd()))
        .transpose()?
        .unwrap_or(false);
    if same {
        *last = now.filter(|(r, _)| settled(r.ctime));
        return Ok(None);
    }
    *last = None;
    backing::copy_atomic(result.as_fd(), results.as_fd(), c"final.md", 0o644)?;
    if let Ok(st) = backing::stat_at(results.as_fd(), c"final.md") {
        *last = Some((Fingerprint::of(&result_st), Fingerprint::of(&st)));
    }
    // A result changed within the last second may change again within the clock's tick
    // without its times moving: compared in full next time.
    if last.is_some_and(|(r, _)| !settled(r.ctime)) {
        *last = None;
    }
    Ok(Some(FinalCopied {
        results_ino: backing::BackingIno::of(&backing::stat(results.as_fd())?),
        results_made,
    }))
}

/// Is a ctime of (seconds, nanoseconds) more than a second in the past?
fn settled((secs, nanos): (i64, i64)) -> bool {
    let t = SystemTime::UNIX_EPOCH
        + std::time::Duration::new(
            u64::try_from(secs).unwrap_or(0),
            u32::try_from(nanos).unwrap_or(0),
        );
    SystemTime::now()
        .duration_since(t)
        .is_ok_and(|d| d > std::time::Duration::from_secs(1))
}

/// What [`copy_final`] wrote: `results/final.md` afresh.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FinalCopied {
    /// The backing inode of `results/`.
    pub results_ino: backing::BackingIno,
    /// `results/` itself was made now (at the store root).
    pub results_made: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn copy_final_streams_and_keeps_holes() {
        use std::os::unix::fs::{FileExt, MetadataExt};
        let tmp = tempfile::tempdir().expect("tempdir");
        let outbox = tmp.path().join("smiths/smith-root/outbox");
        std::fs::create_dir_all(&outbox).expect("mkdir");
        let size = 8u64 << 30; // 8 GiB, two 4 KiB data blocks
        let f = std::fs::File::create(outbox.join("result.md")).expect("create");
        f.set_len(size).expect("truncate");
        f.write_all_at(b"head", 0).expect("write");
        f.write_all_at(b"middle", 4 << 30).expect("write");
        drop(f);
        let root = std::fs::File::open(tmp.path()).expect("open");
        assert!(copy_final(root.as_fd(), &mut None).expect("copy").is_some());
        let fin = tmp.path().join("results/final.md");
        let md = std::fs::metadata(&fin).expect("final.md");
        assert_eq!(md.len(), size);
        assert!(md.blocks() * 512 < 1 << 20, "{} blocks", md.blocks());
        let f = std::fs::File::open(&fin).expect("open");
        let mut buf = [0u8; 6];
        f.read_exact_at(&mut buf, 4 << 30).expect("read");
        assert_eq!(&buf, b"middle");
        f.read_exact_at(&mut buf[..4], 0).expect("read");
        assert_eq!(&buf[..4], b"head");
        // The same content again: nothing written.
        assert_eq!(copy_final(root.as_fd(), &mut None).expect("copy"), None);
        // A change in the data is seen.
        std::fs::OpenOptions::new()
            .write(true)
            .open(outbox.join("result.md"))
            .expect("open")
            .write_all_at(b"MIDDLE", 4 << 30)
            .expect("write");
        assert!(copy_final(root.as_fd(), &mut None).expect("copy").is_some());
        f.read_exact_at(&mut buf, 4 << 30).expect("read");
        assert_eq!(
            &buf, b"middle",
            "the old final.md's inode keeps its content"
        );
        let f = std::fs::File::open(&fin).expect("open");
        f.read_exact_at(&mut buf, 4 << 30).expect("read");
        assert_eq!(&buf, b"MIDDLE");
    }
}
