//! Differential property test (issue 2, "Done when"): the same random operations, run by this
//! process (root, the operator) one at a time on a plain temp dir and inside a smithfs mount,
//! must give the same results and errnos, and leave the same trees (names, types, sizes, modes,
//! owners, contents, symlink targets, link counts, hard-link groups, xattrs).
//!
//! proptest generates the operation lists and shrinks a failure to a minimal one. The default
//! run uses a fixed seed and ≥ 10 000 operations; `PROPTEST_RNG_SEED=<n>` or
//! `PROPTEST_RNG_SEED=random` explores other seeds, and `SMITHFS_DIFF_OPS=<n>` changes the total.
//! `random_operations_agree_inside_a_sandboxed_run_*` run the same comparison from inside a
//! sandboxed run, as the smith itself with every kernel layer on (docs/PROTOCOL-NOTES.md SB15);
//! `SMITHFS_DIFF_SEED=<n>` changes their seed.
//! Failures are persisted in `tests/proptest-regressions/differential.txt` and replayed first
//! on every run: keep that file in git.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use proptest::prelude::*;
use proptest::test_runner::{
    Config, FileFailurePersistence, RngSeed, TestCaseError, TestError, TestRunner,
};

use common::*;

/// A path inside a case root. `Lit` is 1–3 components from a tiny alphabet, so that operations
/// collide often (EEXIST, ENOTEMPTY, ENOTDIR, renames over each other…); `Any` and `New` are
/// resolved against the plain tree just before the operation runs (the same resolved path is
/// then used on both sides), so that most operations act on something that exists.
#[derive(Clone)]
enum P {
    /// This literal relative path.
    Lit(String),
    /// The n-th existing entry (any type, not followed), modulo their number.
    Any(u16),
    /// A name in the n-th existing directory (the case root included).
    New(u16, &'static str),
    /// The n-th existing entry of a kind: 'f' file, 'd' directory, 'l' symlink, 'x' any entry
    /// with an xattr (falls back to `Any` when there is none).
    Kind(u16, char),
}

impl std::fmt::Debug for P {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            P::Lit(s) => write!(f, "{s:?}"),
            P::Any(n) => write!(f, "Any({n})"),
            P::New(n, name) => write!(f, "New({n}, {name:?})"),
            P::Kind(n, k) => write!(f, "Kind({n}, {k:?})"),
        }
    }
}

impl P {
    fn lit(&self) -> &str {
        match self {
            P::Lit(s) => s,
            _ => unreachable!("unresolved path {self:?}"),
        }
    }
}

const NAMES: [&str; 3] = ["a", "b", "c"];

fn lit_path() -> impl Strategy<Value = String> {
    prop_oneof![
        5 => prop::sample::select(NAMES.to_vec()).prop_map(String::from),
        3 => prop::collection::vec(prop::sample::select(NAMES.to_vec()), 2).prop_map(|v| v.join("/")),
        1 => prop::collection::vec(prop::sample::select(NAMES.to_vec()), 3).prop_map(|v| v.join("/")),
    ]
}

/// Names for `P::New`: a few more than `NAMES`, so that a new name is often free.
const NEW_NAMES: [&str; 5] = ["a", "b", "c", "d", "e"];

/// A path with the given weights for literal, existing and new.
fn path_weighted(lit: u32, existing: u32, new: u32) -> impl Strategy<Value = P> {
    prop_oneof![
        lit => lit_path().prop_map(P::Lit),
        existing => any::<u16>().prop_map(P::Any),
        new => (any::<u16>(), prop::sample::select(NEW_NAMES.to_vec())).prop_map(|(n, name)| P::New(n, name)),
    ]
}

/// Mostly an existing entry of kind `k` (see `P::Kind`).
fn of_kind(k: char) -> impl Strategy<Value = P> {
    prop_oneof![
        1 => path_weighted(1, 2, 1),
        4 => any::<u16>().prop_map(move |n| P::Kind(n, k)),
    ]
}

/// Mostly something that exists.
fn existing() -> impl Strategy<Value = P> {
    path_weighted(1, 6, 1)
}

/// Mostly a new name in an existing directory.
fn fresh() -> impl Strategy<Value = P> {
    path_weighted(1, 1, 6)
}

/// Anything.
fn path() -> impl Strategy<Value = P> {
    path_weighted(1, 2, 2)
}

/// Existing entries and directories of the tree under `root` (relative, sorted; symlinks are
/// not followed). The directory list starts with the root itself, as "".
fn listing(root: &Path) -> (Vec<String>, Vec<String>) {
    let mut all = Vec::new();
    let mut dirs = vec![String::new()];
    let mut stack = vec![String::new()];
    while let Some(rel) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(root.join(&rel)) else {
            continue;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let child = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                dirs.push(child.clone());
                stack.push(child.clone());
            }
            all.push(child);
        }
    }
    all.sort();
    dirs.sort();
    (all, dirs)
}

fn resolve(root: &Path, p: &P, all: &[String], dirs: &[String]) -> P {
    match p {
        P::Kind(n, k) => {
            let of_kind: Vec<&String> = all
                .iter()
                .filter(|rel| {
                    let full = root.join(rel);
                    match k {
                        'x' => !xattrs_of(&full).is_empty(),
                        _ => std::fs::symlink_metadata(&full)
                            .map(|m| file_type_char(m.file_type()) == *k)
                            .unwrap_or(false),
                    }
                })
                .collect();
            if of_kind.is_empty() {
                resolve(root, &P::Any(*n), all, dirs)
            } else {
                P::Lit(of_kind[*n as usize % of_kind.len()].clone())
            }
        }
        P::Lit(_) => p.clone(),
        P::Any(n) if all.is_empty() => P::Lit(NAMES[*n as usize % NAMES.len()].into()),
        P::Any(n) => P::Lit(all[*n as usize % all.len()].clone()),
        P::New(n, name) => {
            let d = &dirs[*n as usize % dirs.len()];
            P::Lit(if d.is_empty() {
                name.to_string()
            } else {
                format!("{d}/{name}")
            })
        }
    }
}

/// A time for utimensat: `None` is `UTIME_OMIT`.
type Time = Option<(i64, i64)>;

#[derive(Clone, Debug)]
enum Op {
    Create {
        p: P,
        mode: u32,
        excl: bool,
    },
    Write {
        p: P,
        off: u64,
        len: usize,
        byte: u8,
        append: bool,
    },
    Read {
        p: P,
    },
    Truncate {
        p: P,
        len: u64,
    },
    OpenTrunc {
        p: P,
    },
    Fallocate {
        p: P,
        off: u64,
        len: u64,
    },
    Rename {
        from: P,
        to: P,
        flags: u32,
    },
    Link {
        from: P,
        to: P,
    },
    Unlink {
        p: P,
    },
    Mkdir {
        p: P,
        mode: u32,
    },
    Rmdir {
        p: P,
    },
    Symlink {
        target: P,
        p: P,
    },
    Readlink {
        p: P,
    },
    Chmod {
        p: P,
        mode: u32,
    },
    Chown {
        p: P,
        uid: u32,
        gid: u32,
        follow: bool,
    },
    Utimes {
        p: P,
        atime: Time,
        mtime: Time,
        follow: bool,
    },
    SetXattr {
        p: P,
        name: &'static str,
        value: Vec<u8>,
        flags: i32,
    },
    GetXattr {
        p: P,
        name: &'static str,
    },
    ListXattr {
        p: P,
    },
    RemoveXattr {
        p: P,
        name: &'static str,
    },
    Readdir {
        p: P,
    },
    Stat {
        p: P,
        follow: bool,
    },
}

impl Op {
    /// The paths the operation names (a symlink's target text excluded).
    fn paths_mut(&mut self) -> Vec<&mut P> {
        match self {
            Op::Rename { from, to, .. } | Op::Link { from, to } => vec![from, to],
            Op::Create { p, .. }
            | Op::Write { p, .. }
            | Op::Read { p }
            | Op::Truncate { p, .. }
            | Op::OpenTrunc { p }
            | Op::Fallocate { p, .. }
            | Op::Unlink { p }
            | Op::Mkdir { p, .. }
            | Op::Rmdir { p }
            | Op::Symlink { p, .. }
            | Op::Readlink { p }
            | Op::Chmod { p, .. }
            | Op::Chown { p, .. }
            | Op::Utimes { p, .. }
            | Op::SetXattr { p, .. }
            | Op::GetXattr { p, .. }
            | Op::ListXattr { p }
            | Op::RemoveXattr { p, .. }
            | Op::Readdir { p }
            | Op::Stat { p, .. } => vec![p],
        }
    }
}

fn time() -> impl Strategy<Value = Time> {
    prop_oneof![
        1 => Just(None),
        4 => (0i64..2_000_000_000, 0i64..1_000_000_000).prop_map(Some),
    ]
}

fn xattr_name() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["user.x", "user.y", "trusted.z"])
}

fn op() -> impl Strategy<Value = Op> {
    let mode = prop::sample::select(vec![0o644u32, 0o600, 0o755, 0o000, 0o4755, 0o2775, 0o1777]);
    prop_oneof![
        8 => (fresh(), mode.clone(), any::<bool>()).prop_map(|(p, mode, excl)| Op::Create { p, mode, excl }),
        8 => (of_kind('f'), 0u64..70_000, 0usize..9_000, any::<u8>(), prop::bool::weighted(0.2))
            .prop_map(|(p, off, len, byte, append)| Op::Write { p, off, len, byte, append }),
        5 => of_kind('f').prop_map(|p| Op::Read { p }),
        3 => (of_kind('f'), 0u64..80_000).prop_map(|(p, len)| Op::Truncate { p, len }),
        1 => of_kind('f').prop_map(|p| Op::OpenTrunc { p }),
        1 => (of_kind('f'), 0u64..50_000, 1u64..50_000).prop_map(|(p, off, len)| Op::Fallocate { p, off, len }),
        8 => (existing(), path(), prop::sample::select(vec![0u32, 0, libc::RENAME_NOREPLACE, libc::RENAME_EXCHANGE]))
            .prop_map(|(from, to, flags)| Op::Rename { from, to, flags }),
        3 => (existing(), fresh()).prop_map(|(from, to)| Op::Link { from, to }),
        4 => existing().prop_map(|p| Op::Unlink { p }),
        8 => (fresh(), mode.clone()).prop_map(|(p, mode)| Op::Mkdir { p, mode }),
        3 => of_kind('d').prop_map(|p| Op::Rmdir { p }),
        3 => (lit_path(), fresh()).prop_map(|(target, p)| Op::Symlink { target: P::Lit(target), p }),
        1 => of_kind('l').prop_map(|p| Op::Readlink { p }),
        3 => (existing(), mode).prop_map(|(p, mode)| Op::Chmod { p, mode }),
        2 => (existing(), prop::sample::select(vec![0u32, 1000, 65534]), prop::sample::select(vec![0u32, 1000, 65534]), any::<bool>())
            .prop_map(|(p, uid, gid, follow)| Op::Chown { p, uid, gid, follow }),
        3 => (existing(), time(), time(), any::<bool>())
            .prop_map(|(p, atime, mtime, follow)| Op::Utimes { p, atime, mtime, follow }),
        3 => (existing(), xattr_name(), prop::collection::vec(any::<u8>(), 0..40),
              prop::sample::select(vec![0, 0, libc::XATTR_CREATE, libc::XATTR_REPLACE]))
            .prop_map(|(p, name, value, flags)| Op::SetXattr { p, name, value, flags }),
        2 => (of_kind('x'), xattr_name()).prop_map(|(p, name)| Op::GetXattr { p, name }),
        1 => existing().prop_map(|p| Op::ListXattr { p }),
        1 => (of_kind('x'), xattr_name()).prop_map(|(p, name)| Op::RemoveXattr { p, name }),
        4 => prop::option::weighted(0.8, of_kind('d')).prop_map(|p| Op::Readdir { p: p.unwrap_or(P::Lit(".".into())) }),
        5 => (existing(), any::<bool>()).prop_map(|(p, follow)| Op::Stat { p, follow }),
    ]
}

/// What an operation returned.
#[derive(Debug, PartialEq, Eq)]
enum Val {
    Unit,
    Int(i64),
    Bytes(Data),
    Names(Vec<(String, char)>),
    /// type, mode bits, size (not for directories), nlink, uid, gid
    Stat(char, u32, u64, u64, u32, u32),
    Times(Option<(i64, i64)>, Option<(i64, i64)>),
}

/// An errno, printed by name.
#[derive(PartialEq, Eq)]
struct Errno(i32);

impl std::fmt::Debug for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", nix::errno::Errno::from_raw(self.0))
    }
}

type Outcome = Result<Val, Errno>;

fn c(root: &Path, p: &P) -> CString {
    CString::new(root.join(p.lit()).as_os_str().as_bytes()).unwrap()
}

fn errno() -> Errno {
    Errno(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
}

fn check(rc: libc::c_int) -> Result<libc::c_int, Errno> {
    if rc < 0 {
        Err(errno())
    } else {
        Ok(rc)
    }
}

fn unit(rc: libc::c_int) -> Outcome {
    check(rc).map(|_| Val::Unit)
}

/// Open, run `f` on the descriptor, close.
fn with_fd(path: &CString, flags: i32, mode: u32, f: impl FnOnce(i32) -> Outcome) -> Outcome {
    // SAFETY: valid NUL-terminated path.
    let fd = check(unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC, mode) })?;
    let r = f(fd);
    // SAFETY: fd was opened above and is closed once.
    let rc = unsafe { libc::close(fd) };
    match r {
        Ok(v) if rc == 0 => Ok(v),
        Ok(_) => Err(errno()),
        Err(e) => Err(e),
    }
}

fn timespec(t: Time) -> libc::timespec {
    match t {
        Some((s, ns)) => libc::timespec {
            tv_sec: s,
            tv_nsec: ns,
        },
        None => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
    }
}

fn file_type_char(ft: std::fs::FileType) -> char {
    if ft.is_symlink() {
        'l'
    } else if ft.is_dir() {
        'd'
    } else if ft.is_file() {
        'f'
    } else if ft.is_fifo() {
        'p'
    } else {
        '?'
    }
}

fn io_err(e: std::io::Error) -> Errno {
    Errno(e.raw_os_error().unwrap_or(0))
}

/// Run one operation under `root`.
fn exec(root: &Path, op: &Op) -> Outcome {
    // SAFETY (whole function): libc calls with NUL-terminated paths built by `c`, buffers sized
    // by their lengths, and descriptors owned by `with_fd`.
    unsafe {
        match op {
            Op::Create { p, mode, excl } => {
                let flags = libc::O_CREAT | libc::O_WRONLY | if *excl { libc::O_EXCL } else { 0 };
                with_fd(&c(root, p), flags, *mode, |_| Ok(Val::Unit))
            }
            Op::Write {
                p,
                off,
                len,
                byte,
                append,
            } => {
                let flags = libc::O_WRONLY | if *append { libc::O_APPEND } else { 0 };
                with_fd(&c(root, p), flags, 0, |fd| {
                    let buf = vec![*byte; *len];
                    let n = if *append {
                        libc::write(fd, buf.as_ptr().cast(), buf.len())
                    } else {
                        libc::pwrite(fd, buf.as_ptr().cast(), buf.len(), *off as i64)
                    };
                    if n < 0 {
                        return Err(errno());
                    }
                    Ok(Val::Int(n as i64))
                })
            }
            Op::Read { p } => with_fd(&c(root, p), libc::O_RDONLY, 0, |fd| {
                let mut out = Vec::new();
                let mut buf = vec![0u8; 65536];
                loop {
                    let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
                    if n < 0 {
                        return Err(errno());
                    }
                    if n == 0 {
                        return Ok(Val::Bytes(Data(out)));
                    }
                    out.extend_from_slice(&buf[..n as usize]);
                }
            }),
            Op::Truncate { p, len } => unit(libc::truncate(c(root, p).as_ptr(), *len as i64)),
            Op::OpenTrunc { p } => with_fd(&c(root, p), libc::O_WRONLY | libc::O_TRUNC, 0, |_| {
                Ok(Val::Unit)
            }),
            Op::Fallocate { p, off, len } => with_fd(&c(root, p), libc::O_WRONLY, 0, |fd| {
                unit(libc::fallocate(fd, 0, *off as i64, *len as i64))
            }),
            Op::Rename { from, to, flags } => unit(libc::renameat2(
                libc::AT_FDCWD,
                c(root, from).as_ptr(),
                libc::AT_FDCWD,
                c(root, to).as_ptr(),
                *flags,
            )),
            Op::Link { from, to } => unit(libc::link(c(root, from).as_ptr(), c(root, to).as_ptr())),
            Op::Unlink { p } => unit(libc::unlink(c(root, p).as_ptr())),
            Op::Mkdir { p, mode } => unit(libc::mkdir(c(root, p).as_ptr(), *mode)),
            Op::Rmdir { p } => unit(libc::rmdir(c(root, p).as_ptr())),
            Op::Symlink { target, p } => {
                let t = CString::new(target.lit().as_bytes()).unwrap();
                unit(libc::symlink(t.as_ptr(), c(root, p).as_ptr()))
            }
            Op::Readlink { p } => {
                let mut buf = vec![0u8; 4096];
                let n = libc::readlink(c(root, p).as_ptr(), buf.as_mut_ptr().cast(), buf.len());
                if n < 0 {
                    return Err(errno());
                }
                buf.truncate(n as usize);
                Ok(Val::Bytes(Data(buf)))
            }
            Op::Chmod { p, mode } => unit(libc::chmod(c(root, p).as_ptr(), *mode)),
            Op::Chown {
                p,
                uid,
                gid,
                follow,
            } => {
                let cp = c(root, p);
                unit(if *follow {
                    libc::chown(cp.as_ptr(), *uid, *gid)
                } else {
                    libc::lchown(cp.as_ptr(), *uid, *gid)
                })
            }
            Op::Utimes {
                p,
                atime,
                mtime,
                follow,
            } => {
                let cp = c(root, p);
                let ts = [timespec(*atime), timespec(*mtime)];
                let flags = if *follow {
                    0
                } else {
                    libc::AT_SYMLINK_NOFOLLOW
                };
                check(libc::utimensat(
                    libc::AT_FDCWD,
                    cp.as_ptr(),
                    ts.as_ptr(),
                    flags,
                ))?;
                let md = if *follow {
                    std::fs::metadata(root.join(p.lit()))
                } else {
                    std::fs::symlink_metadata(root.join(p.lit()))
                }
                .map_err(io_err)?;
                Ok(Val::Times(
                    atime.map(|_| (md.atime(), md.atime_nsec())),
                    mtime.map(|_| (md.mtime(), md.mtime_nsec())),
                ))
            }
            Op::SetXattr {
                p,
                name,
                value,
                flags,
            } => {
                let n = CString::new(*name).unwrap();
                unit(libc::setxattr(
                    c(root, p).as_ptr(),
                    n.as_ptr(),
                    value.as_ptr().cast(),
                    value.len(),
                    *flags,
                ))
            }
            Op::GetXattr { p, name } => {
                let n = CString::new(*name).unwrap();
                let mut buf = vec![0u8; 1024];
                let r = libc::getxattr(
                    c(root, p).as_ptr(),
                    n.as_ptr(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                );
                if r < 0 {
                    return Err(errno());
                }
                buf.truncate(r as usize);
                Ok(Val::Bytes(Data(buf)))
            }
            Op::ListXattr { p } => {
                let mut buf = vec![0u8; 4096];
                let r = libc::listxattr(c(root, p).as_ptr(), buf.as_mut_ptr().cast(), buf.len());
                if r < 0 {
                    return Err(errno());
                }
                buf.truncate(r as usize);
                let mut names: Vec<(String, char)> = buf
                    .split(|b| *b == 0)
                    .filter(|s| !s.is_empty())
                    .map(|s| (String::from_utf8_lossy(s).into_owned(), 'x'))
                    .collect();
                names.sort();
                Ok(Val::Names(names))
            }
            Op::RemoveXattr { p, name } => {
                let n = CString::new(*name).unwrap();
                unit(libc::removexattr(c(root, p).as_ptr(), n.as_ptr()))
            }
            Op::Readdir { p } => {
                let rd = std::fs::read_dir(root.join(p.lit())).map_err(io_err)?;
                let mut names = Vec::new();
                for e in rd {
                    let e = e.map_err(io_err)?;
                    let t = e.file_type().map_err(io_err)?;
                    names.push((
                        e.file_name().to_string_lossy().into_owned(),
                        file_type_char(t),
                    ));
                }
                names.sort();
                Ok(Val::Names(names))
            }
            Op::Stat { p, follow } => {
                let full = root.join(p.lit());
                let md = if *follow {
                    std::fs::metadata(full)
                } else {
                    std::fs::symlink_metadata(full)
                }
                .map_err(io_err)?;
                let t = file_type_char(md.file_type());
                Ok(Val::Stat(
                    t,
                    md.mode() & 0o7777,
                    if t == 'd' { 0 } else { md.size() },
                    md.nlink(),
                    md.uid(),
                    md.gid(),
                ))
            }
        }
    }
}

/// One node of a tree snapshot.
#[derive(Debug, PartialEq, Eq)]
struct Node {
    kind: char,
    mode: u32,
    size: u64,
    nlink: u64,
    owner: (u32, u32),
    data: Data,
    xattrs: Vec<(String, Vec<u8>)>,
}

impl Node {
    /// What could not be examined: kind `!`, the errno as its data.
    fn failed(why: Vec<u8>) -> Node {
        Node {
            kind: '!',
            mode: 0,
            size: 0,
            nlink: 0,
            owner: (0, 0),
            data: Data(why),
            xattrs: Vec::new(),
        }
    }
}

/// File contents or a symlink target, printed as a summary (length, FNV-1a hash, the first
/// bytes) so that a failure message stays readable.
#[derive(PartialEq, Eq)]
struct Data(Vec<u8>);

impl std::fmt::Debug for Data {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hash = self.0.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
        });
        let head = &self.0[..self.0.len().min(16)];
        write!(
            f,
            "{} bytes, fnv {hash:016x}, starts {head:?}",
            self.0.len()
        )
    }
}

fn xattrs_of(p: &Path) -> Vec<(String, Vec<u8>)> {
    let cp = CString::new(p.as_os_str().as_bytes()).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: buffers sized by their lengths, NUL-terminated path.
    unsafe {
        let r = libc::llistxattr(cp.as_ptr(), buf.as_mut_ptr().cast(), buf.len());
        if r < 0 {
            // Unprivileged (inside a run), a path may be out of reach: compared as its errno.
            return vec![("<llistxattr>".into(), format!("{:?}", errno()).into_bytes())];
        }
        buf.truncate(r as usize);
        let mut out: Vec<(String, Vec<u8>)> = buf
            .split(|b| *b == 0)
            .filter(|s| !s.is_empty())
            .map(|name| {
                let n = CString::new(name).unwrap();
                let mut v = vec![0u8; 1024];
                let r = libc::lgetxattr(cp.as_ptr(), n.as_ptr(), v.as_mut_ptr().cast(), v.len());
                if r < 0 {
                    // A user.* value needs read permission: compared as its errno.
                    return (
                        String::from_utf8_lossy(name).into_owned(),
                        format!("<{:?}>", errno()).into_bytes(),
                    );
                }
                v.truncate(r as usize);
                (String::from_utf8_lossy(name).into_owned(), v)
            })
            .collect();
        out.sort();
        out
    }
}

/// The whole tree under `root`, plus its hard-link groups (sets of paths sharing an inode).
fn tree(root: &Path) -> (BTreeMap<String, Node>, BTreeSet<BTreeSet<String>>) {
    let mut nodes = BTreeMap::new();
    let mut by_ino: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    // Run unprivileged (inside a run), a directory or file the operations left without read or
    // search permission cannot be listed or read: what fails is compared as its errno (an entry
    // named `DIR/<unlisted>`, the data `<ERRNO>`), on both sides alike.
    let unreadable = |e: std::io::Error| format!("<{:?}>", io_err(e)).into_bytes();
    while let Some(dir) = stack.pop() {
        let entries = match std::fs::read_dir(&dir).and_then(|rd| {
            rd.map(|e| e.map(|e| e.path()))
                .collect::<Result<Vec<_>, _>>()
        }) {
            Ok(entries) => entries,
            Err(e) => {
                let rel = dir
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                nodes.insert(format!("{rel}/<unlisted>"), Node::failed(unreadable(e)));
                continue;
            }
        };
        for p in entries {
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let md = match std::fs::symlink_metadata(&p) {
                Ok(md) => md,
                Err(e) => {
                    nodes.insert(rel, Node::failed(unreadable(e)));
                    continue;
                }
            };
            let kind = file_type_char(md.file_type());
            let data = match kind {
                'f' => std::fs::read(&p).unwrap_or_else(unreadable),
                'l' => std::fs::read_link(&p)
                    .unwrap()
                    .into_os_string()
                    .into_encoded_bytes(),
                _ => Vec::new(),
            };
            if kind == 'd' {
                stack.push(p.clone());
            } else {
                by_ino.entry(md.ino()).or_default().insert(rel.clone());
            }
            nodes.insert(
                rel,
                Node {
                    kind,
                    mode: md.mode() & 0o7777,
                    size: if kind == 'd' { 0 } else { md.size() },
                    nlink: md.nlink(),
                    owner: (md.uid(), md.gid()),
                    data: Data(data),
                    xattrs: xattrs_of(&p),
                },
            );
        }
    }
    (nodes, by_ino.into_values().collect())
}

/// Run `ops` in fresh dirs on both sides; the first disagreement fails the case.
fn run_case(
    plain: &Path,
    mounted: &Path,
    ops: &[Op],
    who: Option<(u32, u32)>,
    total: &AtomicUsize,
    stats: &parking_lot::Mutex<BTreeMap<String, (usize, usize)>>,
) -> Result<(), TestCaseError> {
    as_fs(who, || {
        std::fs::create_dir(plain).unwrap();
        std::fs::create_dir(mounted).unwrap();
    });
    for (i, op) in ops.iter().enumerate() {
        let (all, dirs) = listing(plain);
        let mut op = op.clone();
        for p in op.paths_mut() {
            *p = resolve(plain, p, &all, &dirs);
        }
        let op = &op;
        let want = as_fs(who, || exec(plain, op));
        let got = as_fs(who, || exec(mounted, op));
        total.fetch_add(1, Ordering::Relaxed);
        let kind = format!("{op:?}");
        let kind = kind.split([' ', '{']).next().unwrap_or("").to_string();
        let mut st = stats.lock();
        let e = st.entry(kind).or_default();
        e.0 += 1;
        e.1 += usize::from(want.is_ok());
        drop(st);
        if want != got {
            return Err(TestCaseError::fail(format!(
                "op #{i} {op:?}\n  plain dir: {want:?}\n  smithfs:   {got:?}"
            )));
        }
    }
    let (want_nodes, want_links) = tree(plain);
    let (got_nodes, got_links) = tree(mounted);
    for (k, w) in &want_nodes {
        match got_nodes.get(k) {
            None => {
                return Err(TestCaseError::fail(format!(
                    "{k} missing on smithfs: {w:?}"
                )))
            }
            Some(g) if g != w => {
                return Err(TestCaseError::fail(format!(
                    "{k} differs\n  plain dir: {w:?}\n  smithfs:   {g:?}"
                )))
            }
            _ => {}
        }
    }
    if let Some(k) = got_nodes.keys().find(|k| !want_nodes.contains_key(*k)) {
        return Err(TestCaseError::fail(format!("{k} exists only on smithfs")));
    }
    prop_assert_eq!(want_links, got_links, "hard-link groups differ");
    Ok(())
}

/// The default mount: regular files use FUSE passthrough (reads and writes go from the kernel
/// to the backing file).
#[test]
fn random_operations_agree_with_a_plain_directory() {
    differential(TestMount::new(), 0x5317_0f5e_ed00_0001, false);
}

/// The same as the agents' uid (docs/SPEC.md §12: with the sandbox on, the mount's Operator is
/// root, the daemon's uid or the agents' user): every operation on both sides with this thread's
/// filesystem uid and gid switched to the agents' (the kernel drops the filesystem capabilities
/// with them: `CAP_CHOWN`, `CAP_DAC_OVERRIDE`, `CAP_FOWNER`…), the case roots theirs.
#[test]
fn random_operations_agree_as_the_agents_uid() {
    differential(TestMount::new(), 0x5317_0f5e_ed00_2001, true);
}

/// `--no-passthrough`: every read and write goes through the daemon.
#[test]
fn random_operations_agree_with_a_plain_directory_without_passthrough() {
    differential(
        TestMount::with(MountOpts {
            allow_other: true,
            extra: vec!["--no-passthrough"],
            ..MountOpts::default()
        }),
        0x5317_0f5e_ed00_1001,
        false,
    );
}

/// The same from inside a sandboxed run (issue 27, "Done when"; docs/SPEC.md §12): the smith's
/// agent command is this test binary running [`inside_a_run`], so every operation is made by a
/// smith's process as the agents' uid, in the run's own view and pid namespace, its Landlock
/// domain and under its seccomp filter, on its own `private/diff` (§3: `private/**` is all the
/// owner's) and on a plain directory the config lists in `sandbox.writable`. Both identity modes.
fn differential_inside_a_run(mode: &'static str, seed: u64) {
    if !is_root() {
        eprintln!("skipped: the sandbox needs root");
        return;
    }
    let exe = std::env::current_exe().expect("this test binary");
    // The plain side lives beside the mount point, in a directory the config is written for
    // before the mount exists: the scratch dir of the mount made below is not known yet.
    let holder = tempfile::Builder::new()
        .prefix("smithfs-diff-plain.")
        .tempdir()
        .expect("tempdir");
    std::fs::set_permissions(holder.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let plain = holder.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    let m = TestMount::with_config(&inside_config(&exe, &plain, seed), mode, Vec::new());
    let (uid, gid) = agents_of(&m);
    std::os::unix::fs::chown(&plain, Some(uid), Some(gid)).expect("chown the plain side");
    let root = m.path().join("smiths/smith-root");
    std::fs::write(root.join("inbox/task-1.md"), "compare\n").expect("task");
    let (log, meta) = ended_run(&m, "smiths/smith-root", 1, 900);
    check_inside(&log, &meta, uid, mode);
}

/// config.json of a mount whose runs are [`inside_a_run`] of `exe`, comparing with `plain`
/// (writable for them) from `seed` (`SMITHFS_DIFF_SEED` overrides it, as `PROPTEST_RNG_SEED`
/// does not reach the run; `SMITHFS_DIFF_OPS` is passed on).
fn inside_config(exe: &Path, plain: &Path, seed: u64) -> serde_json::Value {
    let ops = std::env::var("SMITHFS_DIFF_OPS").unwrap_or_else(|_| "10000".into());
    let seed: u64 = std::env::var("SMITHFS_DIFF_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(seed);
    serde_json::json!({
        "agent": {
            "command": [exe, "--exact", "inside_a_run", "--nocapture", "--test-threads", "1"],
            "env": {
                "SMITHFS_DIFF_PLAIN": plain,
                "SMITHFS_DIFF_OPS": ops,
                "SMITHFS_DIFF_SEED": seed.to_string(),
            },
            "retries": 0,
            "timeout_secs": 900,
        },
        "sandbox": { "writable": [plain] },
    })
}

/// The verdict of an [`inside_a_run`] run (`log`, `meta`): it exited 0 after comparing as
/// `uid`, under its seccomp filter with `no_new_privs`.
fn check_inside(log: &str, meta: &serde_json::Value, uid: u32, what: &str) {
    assert_eq!(
        meta["exit_code"], 0,
        "[{what}] the differential inside the run failed: {meta}\n{log}"
    );
    assert!(
        log.contains("operations in")
            && log.contains("agreed")
            && log.contains(&format!("uid {uid} ")),
        "[{what}] the run did not compare as the agents' uid {uid}:\n{log}"
    );
    for layer in ["Seccomp:\t2", "NoNewPrivs:\t1"] {
        assert!(
            log.contains(layer),
            "[{what}] the run was not under its filter ({layer:?}):\n{log}"
        );
    }
    let agreed: Vec<&str> = log.lines().filter(|l| l.contains("agreed")).collect();
    eprintln!("[{what}] {}", agreed.join("\n"));
}

#[test]
fn random_operations_agree_inside_a_sandboxed_run_cgroup() {
    differential_inside_a_run("cgroup", 0x5317_0f5e_ed00_3001);
}

#[test]
fn random_operations_agree_inside_a_sandboxed_run_ancestry() {
    differential_inside_a_run("ancestry", 0x5317_0f5e_ed00_3002);
}

/// The same inside a run of a daemon that is not root (docs/SPEC.md §12 "Without root"): the
/// test user mounts through fusermount3, its run is in a user namespace of its own as that user,
/// with every layer; the test binary and the plain side are copied where the user can reach them.
#[test]
fn random_operations_agree_inside_a_run_of_a_non_root_daemon() {
    let Some((_grant, uid, gid)) = common::user::granted_user() else {
        return;
    };
    let m = common::user::UserMount::init(uid, gid);
    let exe = m.tmp.path().join("differential");
    std::fs::copy(std::env::current_exe().expect("this test binary"), &exe).expect("copy");
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let plain = m.tmp.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    let config = m.path().join("config.json");
    let c = inside_config(&exe, &plain, 0x5317_0f5e_ed00_3003);
    std::fs::write(&config, c.to_string()).expect("config.json");
    for p in [&plain, &config] {
        std::os::unix::fs::chown(p, Some(uid), Some(gid)).expect("chown");
    }
    common::user::smithfs_as(
        uid,
        gid,
        &[std::ffi::OsStr::new("mount"), m.path().as_os_str()],
    )
    .expect_ok("a sandboxed mount as the user");
    m.sh("printf 'compare\\n' > smiths/smith-root/inbox/task-1.md")
        .expect_ok("task");
    let (log, meta) = m.ended_run("smiths/smith-root", 1, 900);
    check_inside(&log, &meta, uid, "non-root daemon");
}

/// The agent of [`differential_inside_a_run`]: run only as a smith's agent command, with
/// `SMITHFS_DIFF_PLAIN` set (a test run without it passes at once). Compares the plain side
/// with `$SMITH_DIR/private/diff` as whoever it runs as, and says so.
#[test]
fn inside_a_run() {
    let (Ok(plain), Ok(smith_dir)) = (
        std::env::var("SMITHFS_DIFF_PLAIN"),
        std::env::var("SMITH_DIR"),
    ) else {
        return;
    };
    let seed: u64 = std::env::var("SMITHFS_DIFF_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .expect("SMITHFS_DIFF_SEED");
    let mounted = Path::new(&smith_dir).join("private/diff");
    std::fs::create_dir(&mounted).expect("private/diff");
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    println!(
        "comparing as uid {uid} gid {gid}, pid {}",
        std::process::id()
    );
    // The filter and no_new_privs, as the kernel reports them for this process.
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    for l in status.lines() {
        if l.starts_with("Seccomp:") || l.starts_with("NoNewPrivs:") {
            println!("{l}");
        }
    }
    compare(Path::new(&plain), &mounted, None, uid != 0, seed);
}

/// The agents' uid and gid of mount `m` (`.smithfs/whoami`).
fn agents_of(m: &TestMount) -> (u32, u32) {
    let who = std::fs::read_to_string(m.path().join(".smithfs/whoami")).expect("whoami");
    let field = |k: &str| -> u32 {
        who.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {k} in whoami:\n{who}"))
    };
    (field("agents uid:"), field("agents gid:"))
}

/// Run `f` with this thread's filesystem uid and gid set to `who` (when given), then back to
/// root's. `setfsuid`/`setfsgid` are per thread; the kernel clears the filesystem capabilities
/// from the effective set while the fsuid is not 0 and restores them after.
fn as_fs<R>(who: Option<(u32, u32)>, f: impl FnOnce() -> R) -> R {
    let Some((uid, gid)) = who else { return f() };
    // SAFETY: setfsgid/setfsuid take ids and change only this thread's credentials.
    unsafe {
        libc::syscall(libc::SYS_setfsgid, gid);
        libc::syscall(libc::SYS_setfsuid, uid);
    }
    let r = f();
    // SAFETY: as above, back to root's.
    unsafe {
        libc::syscall(libc::SYS_setfsuid, 0);
        libc::syscall(libc::SYS_setfsgid, 0);
    }
    r
}

fn differential(m: TestMount, default_seed: u64, as_agents: bool) {
    if !is_root() {
        eprintln!("skipped: the differential test runs as root (chown, trusted.* xattrs)");
        return;
    }
    let plain_root = m.scratch().join("plain");
    let mount_root = m.path().join("diff");
    std::fs::create_dir(&plain_root).unwrap();
    std::fs::create_dir(&mount_root).unwrap();
    let who = as_agents.then(|| agents_of(&m));
    if let Some((uid, gid)) = who {
        for d in [&plain_root, &mount_root] {
            std::os::unix::fs::chown(d, Some(uid), Some(gid)).expect("chown the case root");
        }
    }
    compare(&plain_root, &mount_root, who, as_agents, default_seed);
}

/// The differential loop: random operation lists, each run on a fresh case directory under
/// `plain_root` and under `mount_root` (with this thread's filesystem ids switched to `who`
/// when given), until `SMITHFS_DIFF_OPS` operations (10 000 unless set) agreed. `unprivileged`:
/// the operations run without `CAP_CHOWN` (a chown to a random owner fails on both sides, so
/// its success rate is not checked). Panics with the minimal failing operation list.
fn compare(
    plain_root: &Path,
    mount_root: &Path,
    who: Option<(u32, u32)>,
    unprivileged: bool,
    default_seed: u64,
) {
    let target: usize = std::env::var("SMITHFS_DIFF_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    let mut config = Config {
        cases: 10,
        max_shrink_iters: 4_000,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/proptest-regressions/differential.txt"
        )))),
        ..Config::default()
    };
    match std::env::var("PROPTEST_RNG_SEED").as_deref() {
        Ok("random") => config.rng_seed = RngSeed::Random,
        Ok(_) => {} // Config::default() parsed it
        Err(_) => config.rng_seed = RngSeed::Fixed(default_seed),
    }
    let seed = config.rng_seed;
    let total = AtomicUsize::new(0);
    let case = AtomicUsize::new(0);
    let stats = parking_lot::Mutex::new(BTreeMap::new());
    let strategy = prop::collection::vec(op(), 1..=400);
    let start = std::time::Instant::now();
    // A runner runs `cases` cases; rounds with derived seeds continue until `target` operations.
    for round in 0u64.. {
        if total.load(Ordering::Relaxed) >= target {
            break;
        }
        let mut config = config.clone();
        if let RngSeed::Fixed(s) = seed {
            config.rng_seed = RngSeed::Fixed(s.wrapping_add(round));
        }
        let mut runner = TestRunner::new(config);
        let result = runner.run(&strategy, |ops| {
            let n = case.fetch_add(1, Ordering::Relaxed);
            let name = format!("case-{n}");
            run_case(
                &plain_root.join(&name),
                &mount_root.join(&name),
                &ops,
                who,
                &total,
                &stats,
            )
        });
        match result {
            Ok(()) => {}
            Err(TestError::Fail(why, ops)) => panic!(
                "smithfs disagrees with a plain directory (seed {seed}, round {round}).\n{why}\nminimal operation list ({} ops):\n{ops:#?}",
                ops.len()
            ),
            Err(e) => panic!("{e}"),
        }
    }
    eprintln!(
        "{} operations in {} cases agreed ({:?}, seed {seed})",
        total.load(Ordering::Relaxed),
        case.load(Ordering::Relaxed),
        start.elapsed()
    );
    // How many of each operation ran and how many succeeded: a test that only ever compares
    // ENOENT with ENOENT proves little.
    let stats = stats.into_inner();
    for (k, (n, ok)) in &stats {
        eprintln!("  {k:12} {n:6} run {ok:6} succeeded");
    }
    for (k, (n, ok)) in &stats {
        // Without CAP_CHOWN a chown to a random owner fails on both sides, as it should.
        let exempt = unprivileged && k == "Chown";
        assert!(
            *ok * 20 >= *n || *n < 50 || exempt,
            "{k}: only {ok} of {n} succeeded"
        );
    }
}
