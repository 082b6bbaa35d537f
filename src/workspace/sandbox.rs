//! A Landlock sandbox for the daemon's git when it reads a smith's repository (docs/SPEC.md §3, §11;
//! docs/PROTOCOL-NOTES.md W16).
//!
//! A child's workspace starts from its parent's `HEAD` commit, fetched out of the parent's
//! `workspace/.git` by a git process the daemon runs as root on the backing store. That repository
//! is the parent's to write: a symlinked ref, a `gitdir:` file, an `objects/info/alternates` line or a
//! symlinked object directory could name another smith's repository, and git would follow it — the
//! new child (whose workspace the parent may read) would then hold a sibling's work. Path checks
//! before the fetch race with the parent; a Landlock domain does not: the fetching git (and
//! everything it starts) may read only beneath the parent's `.git` and `project.git`, write only
//! beneath the new workspace, and use the system directories git itself needs. Whatever the parent
//! planted resolves to a path outside those and fails with `EACCES`.

use std::ffi::CStr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use landlock::{
    Access, AccessFs, BitFlags, PathBeneath, Ruleset, RulesetAttr, RulesetCreatedAttr,
    RulesetError, ABI,
};

/// The system directories a git process reads and executes from (binaries, libraries, locale,
/// `/dev/null`, `/proc/self`); those that do not exist are skipped.
const SYSTEM_DIRS: &[&CStr] = &[
    c"/usr", c"/bin", c"/sbin", c"/lib", c"/lib64", c"/lib32", c"/etc", c"/dev", c"/proc",
];

/// A prepared Landlock ruleset: built in the daemon (which it does not restrict), applied in a
/// forked git before exec by [`restrict_self`].
#[derive(Debug)]
pub struct Sandbox {
    ruleset: OwnedFd,
}

/// The Landlock ABI version the kernel offers (1 and up), or `None` when Landlock is not
/// available (kernel without it, or not in the LSM list).
pub fn abi() -> Option<i64> {
    // SAFETY: the version query takes no pointer (NULL, size 0) and returns an int.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32, // LANDLOCK_CREATE_RULESET_VERSION
        )
    };
    (v >= 1).then_some(v)
}

/// A `landlock` crate error as the `std::io::Error` this module's callers report.
fn io(e: RulesetError) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

impl Sandbox {
    /// A ruleset allowing reads beneath each of `read` (descriptors of directories, `O_PATH` is
    /// enough), every right this kernel's ABI handles beneath each of `write`, and reads and
    /// execution of the system directories (writes of `/dev`'s files: `/dev/null`).
    ///
    /// Errors: Landlock is not available (kernel without it, or disabled: `ENOSYS`/`EOPNOTSUPP`),
    /// or a rule could not be added.
    pub fn new(read: &[BorrowedFd<'_>], write: &[BorrowedFd<'_>]) -> std::io::Result<Sandbox> {
        let Some(version) = abi() else {
            return Err(std::io::Error::last_os_error());
        };
        let abi = ABI::from(i32::try_from(version).unwrap_or(i32::MAX));
        let handled = AccessFs::from_all(abi);
        let reading: BitFlags<AccessFs> = AccessFs::ReadFile | AccessFs::ReadDir;
        let mut rules: Vec<PathBeneath<BorrowedFd<'_>>> = Vec::new();
        rules.extend(read.iter().map(|d| PathBeneath::new(*d, reading)));
        rules.extend(write.iter().map(|d| PathBeneath::new(*d, handled)));
        let mut system: Vec<(OwnedFd, BitFlags<AccessFs>)> = Vec::new();
        for path in SYSTEM_DIRS {
            // SAFETY: `path` is a NUL-terminated constant; the result is checked and owned below.
            let raw = unsafe {
                libc::open(
                    path.as_ptr(),
                    libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
                )
            };
            if raw < 0 {
                continue;
            }
            // SAFETY: `raw` is a descriptor we just opened.
            let owned = unsafe { OwnedFd::from_raw_fd(raw) };
            let mut rights = reading | AccessFs::Execute;
            if *path == c"/dev" {
                // `/dev/null` as git's output of last resort.
                rights |= AccessFs::WriteFile;
            }
            system.push((owned, rights & handled));
        }
        let created = Ruleset::default()
            .handle_access(handled)
            .and_then(|r| r.create())
            .and_then(|r| r.add_rules(rules.into_iter().map(Ok::<_, RulesetError>)))
            .and_then(|r| {
                r.add_rules(system.iter().map(|(fd, rights)| {
                    Ok::<_, RulesetError>(PathBeneath::new(fd.as_fd(), *rights))
                }))
            })
            .map_err(io)?;
        let fd: Option<OwnedFd> = created.into();
        let ruleset = fd.ok_or_else(|| std::io::Error::from_raw_os_error(libc::EOPNOTSUPP))?;
        Ok(Sandbox { ruleset })
    }

    /// The raw ruleset descriptor, for [`restrict_self`] in a forked child.
    pub fn raw_fd(&self) -> libc::c_int {
        self.ruleset.as_raw_fd()
    }
}

/// Enter the Landlock domain of ruleset `fd` (and set `no_new_privs`, which Landlock requires).
/// Async-signal-safe: two raw system calls, for `pre_exec`.
///
/// Errors: the errno of `prctl` or `landlock_restrict_self`.
pub fn restrict_self(fd: libc::c_int) -> std::io::Result<()> {
    // SAFETY: raw system calls on plain integers.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::syscall(libc::SYS_landlock_restrict_self, fd, 0u32) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The sandbox for making a child's workspace (docs/PROTOCOL-NOTES.md W16): read beneath the
/// parent's `workspace/.git` (the parent of `children`, which must hold a real `workspace/.git`
/// directory: no symlink, no `gitdir:` file) and `project.git` under `store_root`; write beneath the
/// new smith dir `tmp` in `children`.
///
/// Errors: one of those is missing or not a directory, or Landlock is unavailable.
pub fn for_child(
    store_root: BorrowedFd<'_>,
    children: BorrowedFd<'_>,
    tmp: &CStr,
) -> std::io::Result<Sandbox> {
    let io = |e: nix::errno::Errno| std::io::Error::from_raw_os_error(e as i32);
    // SAFETY: `children` is an open descriptor and ".." a NUL-terminated constant; checked below.
    let raw = unsafe {
        libc::openat(
            children.as_raw_fd(),
            c"..".as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `raw` is a descriptor we just opened.
    let smith = unsafe { OwnedFd::from_raw_fd(raw) };
    let ws = crate::backing::lookup(smith.as_fd(), c"workspace").map_err(io)?;
    let git = crate::backing::lookup(ws.as_fd(), c".git").map_err(io)?;
    let st = crate::backing::stat(git.as_fd()).map_err(io)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "the parent's workspace/.git is not a directory",
        ));
    }
    let project = crate::backing::lookup(store_root, c"project.git").map_err(io)?;
    let new = crate::backing::lookup(children, tmp).map_err(io)?;
    Sandbox::new(&[git.as_fd(), project.as_fd()], &[new.as_fd()])
}
