//! Pure parsers for the `/proc` files that identity resolution reads (docs/SPEC.md §2): a process's
//! `stat` (parent, process group, start time — the key that keeps a recycled pid from inheriting an
//! identity), `status` (thread group, pid namespaces, credentials), `cgroup` (the smith's cgroup in
//! cgroup mode) and `mountinfo` (to find smithfs's own FUSE mounts).
//!
//! Every parser takes the file's raw bytes (as `std::fs::read` returns them; `/proc` text may hold
//! arbitrary bytes in command names and paths), never reads the filesystem, never panics on any
//! input, and reports a malformed file as a [`ParseError`] naming the file, the line where it
//! applies, the field and the offending value.
//!
//! Long on purpose: half of it is the table and property tests of the parsers.

use std::ffi::OsString;
use std::fmt;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;
use std::str::FromStr;

/// Which `/proc` file a [`ParseError`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProcFile {
    /// `/proc/<pid>/stat` (or `/proc/<pid>/task/<tid>/stat`).
    Stat,
    /// `/proc/<pid>/status`.
    Status,
    /// `/proc/<pid>/cgroup`.
    Cgroup,
    /// `/proc/<pid>/mountinfo` (usually `/proc/self/mountinfo`).
    Mountinfo,
}

impl fmt::Display for ProcFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ProcFile::Stat => "/proc/<pid>/stat",
            ProcFile::Status => "/proc/<pid>/status",
            ProcFile::Cgroup => "/proc/<pid>/cgroup",
            ProcFile::Mountinfo => "/proc/<pid>/mountinfo",
        })
    }
}

/// What is wrong with a `/proc` file; part of a [`ParseError`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseErrorKind {
    /// A required field or line is absent (e.g. `Tgid:` in `status`).
    #[error("missing {0}")]
    Missing(&'static str),
    /// A field is present but its value does not parse. `value` is the text found (lossily decoded,
    /// at most 40 characters).
    #[error("{field}: {value:?} is not {expected}")]
    Invalid {
        /// The field's name (`ppid`, `Uid`, `major:minor`, …).
        field: &'static str,
        /// The value found.
        value: String,
        /// What was expected, as a noun phrase (`a decimal number`).
        expected: &'static str,
    },
    /// The file's shape is wrong (e.g. no `)` after the command name in `stat`).
    #[error("{0}")]
    Malformed(&'static str),
}

/// A `/proc` file that could not be parsed. Displays as
/// `/proc/<pid>/status line 9: Uid: "1000 x" is not four decimal ids`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}{}: {kind}", LineSuffix(*.line))]
pub struct ParseError {
    /// The file.
    pub file: ProcFile,
    /// 1-based line number, when the file has several lines and the problem is on one of them.
    pub line: Option<usize>,
    /// What is wrong.
    pub kind: ParseErrorKind,
}

struct LineSuffix(Option<usize>);

impl fmt::Display for LineSuffix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(n) => write!(f, " line {n}"),
            None => Ok(()),
        }
    }
}

impl ParseError {
    fn new(file: ProcFile, line: Option<usize>, kind: ParseErrorKind) -> Self {
        ParseError { file, line, kind }
    }
}

/// The text of `bytes` for an error message: lossy UTF-8, at most 40 characters.
fn excerpt(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out: String = text.chars().take(40).collect();
    if text.chars().nth(40).is_some() {
        out.push('…');
    }
    out
}

fn invalid(
    file: ProcFile,
    line: Option<usize>,
    field: &'static str,
    value: &[u8],
    expected: &'static str,
) -> ParseError {
    ParseError::new(
        file,
        line,
        ParseErrorKind::Invalid {
            field,
            value: excerpt(value),
            expected,
        },
    )
}

/// Parses a decimal number: optional `-` only for signed types (Rust's `FromStr` rules, minus `+`).
fn number<T: FromStr>(
    file: ProcFile,
    line: Option<usize>,
    field: &'static str,
    value: &[u8],
) -> Result<T, ParseError> {
    let parsed = if value.first() == Some(&b'+') {
        None
    } else {
        std::str::from_utf8(value)
            .ok()
            .and_then(|s| s.parse::<T>().ok())
    };
    parsed.ok_or_else(|| invalid(file, line, field, value, "a decimal number"))
}

/// Splits on runs of ASCII whitespace, dropping empty pieces.
fn words(bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
    bytes
        .split(u8::is_ascii_whitespace)
        .filter(|w| !w.is_empty())
}

/// Lines of `input` with their 1-based numbers; a final newline does not make an extra line.
fn lines(input: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    let body = input.strip_suffix(b"\n").unwrap_or(input);
    let empty = body.is_empty();
    body.split(|b| *b == b'\n')
        .enumerate()
        .filter(move |_| !empty)
        .map(|(i, l)| (i + 1, l))
}

// ---------------------------------------------------------------------------------------------
// /proc/<pid>/stat
// ---------------------------------------------------------------------------------------------

/// A process's scheduling state, the third field of `stat` (see proc(5)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProcState {
    /// `R`: running or runnable.
    Running,
    /// `S`: interruptible sleep.
    Sleeping,
    /// `D`: uninterruptible (disk) sleep.
    DiskSleep,
    /// `Z`: zombie — exited, not yet reaped. It still holds its pid and start time.
    Zombie,
    /// `T`: stopped by a signal.
    Stopped,
    /// `t`: stopped by a tracer.
    TracingStop,
    /// `X` or `x`: dead (about to vanish).
    Dead,
    /// `K`: wakekill (old kernels).
    Wakekill,
    /// `W`: waking or paging (old kernels).
    Waking,
    /// `P`: parked.
    Parked,
    /// `I`: idle kernel thread.
    Idle,
    /// Any other single byte, kept for forward compatibility.
    Other(u8),
}

impl ProcState {
    /// The state for the code byte `c` of `stat`.
    pub fn from_code(c: u8) -> Self {
        match c {
            b'R' => ProcState::Running,
            b'S' => ProcState::Sleeping,
            b'D' => ProcState::DiskSleep,
            b'Z' => ProcState::Zombie,
            b'T' => ProcState::Stopped,
            b't' => ProcState::TracingStop,
            b'X' | b'x' => ProcState::Dead,
            b'K' => ProcState::Wakekill,
            b'W' => ProcState::Waking,
            b'P' => ProcState::Parked,
            b'I' => ProcState::Idle,
            other => ProcState::Other(other),
        }
    }

    /// True for a process that has exited (zombie or dead): it runs no code and can make no request.
    pub fn has_exited(self) -> bool {
        match self {
            ProcState::Zombie | ProcState::Dead => true,
            ProcState::Running
            | ProcState::Sleeping
            | ProcState::DiskSleep
            | ProcState::Stopped
            | ProcState::TracingStop
            | ProcState::Wakekill
            | ProcState::Waking
            | ProcState::Parked
            | ProcState::Idle
            | ProcState::Other(_) => false,
        }
    }
}

/// The fields of `/proc/<pid>/stat` that identity resolution needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    /// Field 1: the process (or thread) id, as seen in the reader's pid namespace; always > 0.
    pub pid: i32,
    /// Field 2: the command name without its parentheses, raw bytes (the kernel does not escape it;
    /// it may contain spaces, parentheses and newlines).
    pub comm: OsString,
    /// Field 3: the scheduling state.
    pub state: ProcState,
    /// Field 4: the parent's pid; 0 for pid 1, kernel threads and parents outside the namespace.
    pub ppid: i32,
    /// Field 5: the process group id.
    pub pgrp: i32,
    /// Field 6: the session id.
    pub session: i32,
    /// Field 22: start time after boot, in clock ticks (`sysconf(_SC_CLK_TCK)`, usually 100/s).
    /// With `pid` it identifies one process across pid reuse.
    pub starttime: u64,
}

/// Parses `/proc/<pid>/stat`: `pid (comm) state ppid pgrp session … starttime …`.
///
/// The command name is everything between the first `(` and the *last* `)`, so a name such as
/// `a) b (c` is read correctly. A trailing newline is optional; fields after `starttime` are
/// ignored (their number varies between kernels).
///
/// # Errors
/// A [`ParseError`] for [`ProcFile::Stat`] if the parentheses are missing, a field is missing, the
/// state is not one byte, or a number does not parse (pid must be positive).
pub fn parse_stat(input: &[u8]) -> Result<Stat, ParseError> {
    const F: ProcFile = ProcFile::Stat;
    let malformed = |what| ParseError::new(F, None, ParseErrorKind::Malformed(what));
    let open = input
        .iter()
        .position(|b| *b == b'(')
        .ok_or_else(|| malformed("no `(` before the command name"))?;
    let close = input
        .iter()
        .rposition(|b| *b == b')')
        .filter(|c| *c > open)
        .ok_or_else(|| malformed("no `)` after the command name"))?;
    let pid_text = input[..open]
        .strip_suffix(b" ")
        .ok_or_else(|| malformed("expected `<pid> (` at the start"))?;
    let pid: i32 = number(F, None, "pid", pid_text)?;
    if pid <= 0 {
        return Err(invalid(F, None, "pid", pid_text, "a positive pid"));
    }
    let comm = OsString::from_vec(input[open + 1..close].to_vec());
    let rest = &input[close + 1..];
    if !rest.starts_with(b" ") {
        return Err(malformed("expected a space after the command name's `)`"));
    }
    let fields: Vec<&[u8]> = words(rest).collect();
    let field = |index: usize, name: &'static str| {
        fields
            .get(index)
            .copied()
            .ok_or(ParseError::new(F, None, ParseErrorKind::Missing(name)))
    };
    let state = match field(0, "state")? {
        [c] => ProcState::from_code(*c),
        other => return Err(invalid(F, None, "state", other, "a one-letter state")),
    };
    Ok(Stat {
        pid,
        comm,
        state,
        ppid: number(F, None, "ppid", field(1, "ppid")?)?,
        pgrp: number(F, None, "pgrp", field(2, "pgrp")?)?,
        session: number(F, None, "session", field(3, "session")?)?,
        starttime: number(F, None, "starttime", field(19, "starttime (field 22)")?)?,
    })
}

// ---------------------------------------------------------------------------------------------
// /proc/<pid>/status
// ---------------------------------------------------------------------------------------------

/// The four ids of a `Uid:` or `Gid:` line of `status`, in the kernel's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ids {
    /// Real id.
    pub real: u32,
    /// Effective id.
    pub effective: u32,
    /// Saved set-id.
    pub saved: u32,
    /// Filesystem id (what the kernel checks file access with).
    pub fs: u32,
}

/// The fields of `/proc/<pid>/status` that identity resolution needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// `Tgid:` the thread group id (the process id of a thread), in the reader's pid namespace.
    pub tgid: i32,
    /// `PPid:` the parent's pid (0 if none or outside the namespace).
    pub ppid: i32,
    /// `NSpid:` the pid in each pid namespace the process is in, from the namespace of the `/proc`
    /// mount down to the process's own; `None` if the line is absent (kernels before 4.1).
    pub nspid: Option<Vec<i32>>,
    /// `Uid:` real, effective, saved and filesystem uid.
    pub uid: Ids,
    /// `Gid:` real, effective, saved and filesystem gid.
    pub gid: Ids,
    /// `Groups:` supplementary group ids (possibly empty).
    pub groups: Vec<u32>,
}

/// Parses `/proc/<pid>/status` (`Key:\tvalue` lines). Lines with other keys, and lines without a
/// `:`, are ignored; if a key repeats, its first line counts. The `Name:` line cannot forge other
/// keys: the kernel escapes newlines in it.
///
/// # Errors
/// A [`ParseError`] for [`ProcFile::Status`] if `Tgid`, `PPid`, `Uid`, `Gid` or `Groups` is missing,
/// or any of those or `NSpid` does not parse (`Uid`/`Gid` need exactly four ids).
pub fn parse_status(input: &[u8]) -> Result<Status, ParseError> {
    const F: ProcFile = ProcFile::Status;
    let mut tgid = None;
    let mut ppid = None;
    let mut nspid = None;
    let mut uid = None;
    let mut gid = None;
    let mut groups = None;
    for (n, line) in lines(input) {
        let at = Some(n);
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        let (key, value) = (&line[..colon], &line[colon + 1..]);
        match key {
            b"Tgid" if tgid.is_none() => tgid = Some(number(F, at, "Tgid", value.trim_ascii())?),
            b"PPid" if ppid.is_none() => ppid = Some(number(F, at, "PPid", value.trim_ascii())?),
            b"NSpid" if nspid.is_none() => nspid = Some(list(F, at, "NSpid", value)?),
            b"Uid" if uid.is_none() => uid = Some(ids(F, at, "Uid", value)?),
            b"Gid" if gid.is_none() => gid = Some(ids(F, at, "Gid", value)?),
            b"Groups" if groups.is_none() => groups = Some(list(F, at, "Groups", value)?),
            _ => {}
        }
    }
    let missing = |what| ParseError::new(F, None, ParseErrorKind::Missing(what));
    Ok(Status {
        tgid: tgid.ok_or_else(|| missing("the Tgid: line"))?,
        ppid: ppid.ok_or_else(|| missing("the PPid: line"))?,
        nspid,
        uid: uid.ok_or_else(|| missing("the Uid: line"))?,
        gid: gid.ok_or_else(|| missing("the Gid: line"))?,
        groups: groups.ok_or_else(|| missing("the Groups: line"))?,
    })
}

/// A whitespace-separated list of decimal numbers.
fn list<T: FromStr>(
    file: ProcFile,
    line: Option<usize>,
    field: &'static str,
    value: &[u8],
) -> Result<Vec<T>, ParseError> {
    words(value).map(|w| number(file, line, field, w)).collect()
}

/// Exactly four whitespace-separated ids.
fn ids(
    file: ProcFile,
    line: Option<usize>,
    field: &'static str,
    value: &[u8],
) -> Result<Ids, ParseError> {
    let all: Vec<u32> = list(file, line, field, value)?;
    match all[..] {
        [real, effective, saved, fs] => Ok(Ids {
            real,
            effective,
            saved,
            fs,
        }),
        _ => Err(invalid(
            file,
            line,
            field,
            value.trim_ascii(),
            "four decimal ids",
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// /proc/<pid>/cgroup
// ---------------------------------------------------------------------------------------------

/// One cgroup v1 hierarchy a process is in: a line `id:controllers:path` with a non-zero id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupV1 {
    /// The hierarchy id (first field, ≥ 1).
    pub id: u32,
    /// The controllers bound to the hierarchy (`cpu`, `cpuacct`, …); empty for a named-only one.
    pub controllers: Vec<String>,
    /// The hierarchy's name, from a `name=…` entry (e.g. `systemd`), if any.
    pub name: Option<String>,
    /// The cgroup path within the hierarchy, starting with `/`.
    pub path: PathBuf,
}

/// What `/proc/<pid>/cgroup` says.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Cgroups {
    /// The cgroup v2 path, from the `0::<path>` line, relative to the reader's cgroup namespace
    /// root (starts with `/`, may start with `/..` across namespaces). `None` if there is no such
    /// line (a pure v1 system).
    pub v2: Option<PathBuf>,
    /// The kernel marked the v2 cgroup ` (deleted)` (it was removed); the suffix is not in `v2`.
    pub v2_deleted: bool,
    /// Every v1 hierarchy, in file order.
    pub v1: Vec<CgroupV1>,
}

/// Parses `/proc/<pid>/cgroup`: lines `hierarchy-id:controller-list:path`. The path is everything
/// after the second `:` (it may itself contain `:`). Empty lines are skipped; an empty file gives
/// empty [`Cgroups`].
///
/// # Errors
/// A [`ParseError`] for [`ProcFile::Cgroup`] with the line number if a line has fewer than three
/// fields, a non-numeric id, a path not starting with `/`, id 0 with controllers, or a second
/// `0::` line.
pub fn parse_cgroup(input: &[u8]) -> Result<Cgroups, ParseError> {
    const F: ProcFile = ProcFile::Cgroup;
    let mut out = Cgroups::default();
    for (n, line) in lines(input).filter(|(_, l)| !l.is_empty()) {
        let at = Some(n);
        let malformed = |what| ParseError::new(F, at, ParseErrorKind::Malformed(what));
        let mut parts = line.splitn(3, |b| *b == b':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(malformed(
                "expected `hierarchy-id:controllers:path` (two `:`)",
            ));
        };
        let id: u32 = number(F, at, "hierarchy id", id)?;
        if !path.starts_with(b"/") {
            return Err(invalid(F, at, "path", path, "a path starting with `/`"));
        }
        if id == 0 {
            if !controllers.is_empty() {
                return Err(invalid(
                    F,
                    at,
                    "controllers",
                    controllers,
                    "empty (hierarchy 0 is cgroup v2)",
                ));
            }
            if out.v2.is_some() {
                return Err(malformed("a second `0::` (cgroup v2) line"));
            }
            let (path, deleted) = match path.strip_suffix(b" (deleted)") {
                Some(p) => (p, true),
                None => (path, false),
            };
            out.v2 = Some(PathBuf::from(OsString::from_vec(path.to_vec())));
            out.v2_deleted = deleted;
        } else {
            let mut names = Vec::new();
            let mut name = None;
            for entry in controllers.split(|b| *b == b',').filter(|e| !e.is_empty()) {
                let entry = String::from_utf8_lossy(entry).into_owned();
                match entry.strip_prefix("name=") {
                    Some(n) => name = Some(n.to_owned()),
                    None => names.push(entry),
                }
            }
            out.v1.push(CgroupV1 {
                id,
                controllers: names,
                name,
                path: PathBuf::from(OsString::from_vec(path.to_vec())),
            });
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// /proc/<pid>/mountinfo
// ---------------------------------------------------------------------------------------------

/// One line of `/proc/<pid>/mountinfo` (proc(5)):
/// `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountInfo {
    /// Field 1: unique id of the mount (may be reused after unmount).
    pub mount_id: u32,
    /// Field 2: id of the parent mount (itself for the namespace root).
    pub parent_id: u32,
    /// Field 3, before `:`: the device's major number (0 for FUSE and other virtual filesystems).
    pub major: u32,
    /// Field 3, after `:`: the device's minor number.
    pub minor: u32,
    /// Field 4: the root of the mount within its filesystem, octal escapes decoded.
    pub root: PathBuf,
    /// Field 5: the mount point relative to the reader's root, octal escapes decoded (`\040` → ` `).
    pub mount_point: PathBuf,
    /// Field 6: per-mount options (`rw,nosuid,nodev,relatime`).
    pub mount_options: String,
    /// The optional fields between field 6 and the `-` separator (`shared:1`, `master:2`, …).
    pub optional_fields: Vec<String>,
    /// The filesystem type after `-`, escapes decoded: `fuse.<subtype>`, `fuse`, `ext4`, …
    pub fs_type: String,
    /// The mount source after the type, escapes decoded (for FUSE, the `fsname` option).
    pub source: OsString,
    /// The per-superblock options, as the kernel printed them (escapes *not* decoded, so an escaped
    /// `,` inside a value stays distinguishable from the separator).
    pub super_options: String,
}

impl MountInfo {
    /// True for a FUSE mount: type `fuse`, `fuseblk`, or `fuse.<subtype>`/`fuseblk.<subtype>`.
    pub fn is_fuse(&self) -> bool {
        let t = self.fs_type.as_str();
        t == "fuse" || t == "fuseblk" || t.starts_with("fuse.") || t.starts_with("fuseblk.")
    }

    /// The FUSE subtype (`smithfs` in `fuse.smithfs`), if this is a FUSE mount with one.
    pub fn fuse_subtype(&self) -> Option<&str> {
        let t = self.fs_type.as_str();
        t.strip_prefix("fuse.")
            .or_else(|| t.strip_prefix("fuseblk."))
            .filter(|s| !s.is_empty())
    }

    /// True for a smithfs mount: a FUSE mount whose subtype or source (`fsname`) is `smithfs`.
    pub fn is_smithfs(&self) -> bool {
        self.is_fuse()
            && (self.fuse_subtype() == Some(super::mount::FS_NAME)
                || self.source.as_encoded_bytes() == super::mount::FS_NAME.as_bytes())
    }
}

/// Decodes the kernel's octal escapes (`\040` space, `\011` tab, `\012` newline, `\134` backslash;
/// any `\` + three octal digits with value ≤ 0o377). A `\` not followed by such digits is kept.
pub fn unescape_octal(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        if field[i] == b'\\' {
            if let Some(&[a, b, c]) = field.get(i + 1..i + 4) {
                let octal = |d: u8| (b'0'..=b'7').contains(&d).then(|| u32::from(d - b'0'));
                if let (Some(a), Some(b), Some(c)) = (octal(a), octal(b), octal(c)) {
                    if let Ok(byte) = u8::try_from(a * 64 + b * 8 + c) {
                        out.push(byte);
                        i += 4;
                        continue;
                    }
                }
            }
        }
        out.push(field[i]);
        i += 1;
    }
    out
}

/// Parses one line of `mountinfo` (a trailing newline is allowed). Fields are separated by single
/// spaces (an empty source shows as two spaces and is kept as empty); fields after the super
/// options, if a future kernel adds any, are ignored.
///
/// # Errors
/// A [`ParseError`] for [`ProcFile::Mountinfo`] (without a line number) if a field is missing, the
/// `-` separator is absent, or an id or `major:minor` does not parse.
pub fn parse_mountinfo_line(line: &[u8]) -> Result<MountInfo, ParseError> {
    parse_mount_line(line, None)
}

/// Parses a whole `mountinfo` file, one [`MountInfo`] per non-empty line, in order.
///
/// # Errors
/// The first line's error from [`parse_mountinfo_line`], with its 1-based line number.
pub fn parse_mountinfo(input: &[u8]) -> Result<Vec<MountInfo>, ParseError> {
    lines(input)
        .filter(|(_, l)| !l.is_empty())
        .map(|(n, l)| parse_mount_line(l, Some(n)))
        .collect()
}

fn parse_mount_line(line: &[u8], at: Option<usize>) -> Result<MountInfo, ParseError> {
    const F: ProcFile = ProcFile::Mountinfo;
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let fields: Vec<&[u8]> = line.split(|b| *b == b' ').collect();
    let field = |index: usize, name: &'static str| {
        fields
            .get(index)
            .copied()
            .ok_or(ParseError::new(F, at, ParseErrorKind::Missing(name)))
    };
    let mount_id = number(F, at, "mount id", field(0, "mount id")?)?;
    let parent_id = number(F, at, "parent id", field(1, "parent id")?)?;
    let dev = field(2, "major:minor")?;
    let (major, minor) = match dev.iter().position(|b| *b == b':') {
        Some(colon) => (
            number(F, at, "major:minor", &dev[..colon])?,
            number(F, at, "major:minor", &dev[colon + 1..])?,
        ),
        None => return Err(invalid(F, at, "major:minor", dev, "`major:minor`")),
    };
    let root = field(3, "root")?;
    let mount_point = field(4, "mount point")?;
    let mount_options = field(5, "mount options")?;
    let sep = fields
        .iter()
        .skip(6)
        .position(|f| *f == b"-")
        .map(|p| p + 6)
        .ok_or(ParseError::new(
            F,
            at,
            ParseErrorKind::Missing("the `-` separator before the filesystem type"),
        ))?;
    let fs_type = field(sep + 1, "filesystem type")?;
    let source = field(sep + 2, "mount source")?;
    let super_options = field(sep + 3, "super options")?;
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    Ok(MountInfo {
        mount_id,
        parent_id,
        major,
        minor,
        root: PathBuf::from(OsString::from_vec(unescape_octal(root))),
        mount_point: PathBuf::from(OsString::from_vec(unescape_octal(mount_point))),
        mount_options: text(mount_options),
        optional_fields: fields[6..sep]
            .iter()
            .filter(|f| !f.is_empty())
            .map(|f| text(f))
            .collect(),
        fs_type: text(&unescape_octal(fs_type)),
        source: OsString::from_vec(unescape_octal(source)),
        super_options: text(super_options),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;

    /// A realistic stat line with `comm` and the state / ppid / starttime substituted.
    fn stat_line(pid: i32, comm: &[u8], state: char, ppid: i32, starttime: u64) -> Vec<u8> {
        let mut v = format!("{pid} (").into_bytes();
        v.extend_from_slice(comm);
        v.extend_from_slice(
            format!(
                ") {state} {ppid} 4242 4100 34816 4242 4194304 102 0 0 0 0 0 0 0 20 0 1 0 \
                 {starttime} 3133440 399 18446744073709551615 94586633007104 0 0 0 0 0 0 0 0 0 \
                 0 0 0 17 0 0 0 0 0 0\n"
            )
            .as_bytes(),
        );
        v
    }

    #[test]
    fn stat_table() {
        struct Case {
            input: Vec<u8>,
            pid: i32,
            comm: &'static [u8],
            state: ProcState,
            ppid: i32,
            starttime: u64,
        }
        let cases = [
            Case {
                input: b"13879 (cat) R 13877 13877 4754 0 -1 4194304 102 0 0 0 0 0 0 0 20 0 1 0 38720 3133440 399 18446744073709551615 94586633007104 94586633026985 140730953772816 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 94586633042992 94586633044608 94586872635392 140730953775841 140730953775861 140730953775861 140730953777131 0\n".to_vec(),
                pid: 13879,
                comm: b"cat",
                state: ProcState::Running,
                ppid: 13877,
                starttime: 38720,
            },
            Case {
                input: stat_line(4242, b"a) b (c", 'S', 1, 987654),
                pid: 4242,
                comm: b"a) b (c",
                state: ProcState::Sleeping,
                ppid: 1,
                starttime: 987654,
            },
            Case {
                // A zombie: vsize/rss are 0, but pid, ppid and start time remain.
                input: b"5150 (sleep) Z 5100 5100 4754 0 -1 4227084 0 0 0 0 0 0 0 0 20 0 1 0 123456 0 0 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0".to_vec(),
                pid: 5150,
                comm: b"sleep",
                state: ProcState::Zombie,
                ppid: 5100,
                starttime: 123456,
            },
            Case {
                input: stat_line(7, b"", 'I', 2, 0),
                pid: 7,
                comm: b"",
                state: ProcState::Idle,
                ppid: 2,
                starttime: 0,
            },
            Case {
                input: stat_line(8, b"((()))", 't', 0, u64::MAX),
                pid: 8,
                comm: b"((()))",
                state: ProcState::TracingStop,
                ppid: 0,
                starttime: u64::MAX,
            },
            Case {
                input: stat_line(9, b"new\nline \xff", 'D', 3, 5),
                pid: 9,
                comm: b"new\nline \xff",
                state: ProcState::DiskSleep,
                ppid: 3,
                starttime: 5,
            },
            Case {
                // Only the fields up to starttime: enough.
                input: b"10 (x) X 1 1 1 0 0 0 0 0 0 0 0 0 0 0 20 0 1 0 77".to_vec(),
                pid: 10,
                comm: b"x",
                state: ProcState::Dead,
                ppid: 1,
                starttime: 77,
            },
        ];
        for c in cases {
            let s = parse_stat(&c.input).unwrap_or_else(|e| panic!("{:?}: {e}", c.input));
            assert_eq!(s.pid, c.pid);
            assert_eq!(s.comm.as_bytes(), c.comm);
            assert_eq!(s.state, c.state);
            assert_eq!(s.ppid, c.ppid);
            assert_eq!(s.starttime, c.starttime);
        }
        let s = parse_stat(&stat_line(4242, b"a) b (c", 'Z', 1, 3)).unwrap();
        assert_eq!((s.pgrp, s.session), (4242, 4100));
        assert!(s.state.has_exited());
    }

    #[test]
    fn stat_errors() {
        let cases: &[(&[u8], &str)] = &[
            (b"", "/proc/<pid>/stat: no `(` before the command name"),
            (
                b"12 (cat",
                "/proc/<pid>/stat: no `)` after the command name",
            ),
            (
                b"12 )cat( R",
                "/proc/<pid>/stat: no `)` after the command name",
            ),
            (
                b"12(cat) R",
                "/proc/<pid>/stat: expected `<pid> (` at the start",
            ),
            (
                b"x (cat) R",
                "/proc/<pid>/stat: pid: \"x\" is not a decimal number",
            ),
            (
                b"0 (cat) R",
                "/proc/<pid>/stat: pid: \"0\" is not a positive pid",
            ),
            (
                b"+5 (cat) R",
                "/proc/<pid>/stat: pid: \"+5\" is not a decimal number",
            ),
            (
                b"5 (cat)R 1",
                "/proc/<pid>/stat: expected a space after the command name's `)`",
            ),
            (b"5 (cat) ", "/proc/<pid>/stat: missing state"),
            (
                b"5 (cat) RS 1",
                "/proc/<pid>/stat: state: \"RS\" is not a one-letter state",
            ),
            (b"5 (cat) R", "/proc/<pid>/stat: missing ppid"),
            (
                b"5 (cat) R one 2 3",
                "/proc/<pid>/stat: ppid: \"one\" is not a decimal number",
            ),
            (
                b"5 (cat) R 1 2 3 4",
                "/proc/<pid>/stat: missing starttime (field 22)",
            ),
            (
                b"5 (cat) R 1 1 1 0 0 0 0 0 0 0 0 0 0 0 20 0 1 0 -3",
                "/proc/<pid>/stat: starttime: \"-3\" is not a decimal number",
            ),
        ];
        for (input, want) in cases {
            let err = parse_stat(input).unwrap_err();
            assert_eq!(
                err.to_string(),
                *want,
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    const STATUS: &[u8] =
        b"Name:\tcat\nUmask:\t0022\nState:\tR (running)\nTgid:\t13880\nNgid:\t0\n\
Pid:\t13881\nPPid:\t13877\nTracerPid:\t0\nUid:\t1000\t1001\t1002\t1003\nGid:\t100\t101\t102\t103\n\
FDSize:\t256\nGroups:\t4 24 27 \nNStgid:\t13880\t1\nNSpid:\t13881\t2\nNSpgid:\t13877\t1\n\
NSsid:\t4754\t1\nVmPeak:\t    3060 kB\nThreads:\t2\n";

    #[test]
    fn status_fixture() {
        let s = parse_status(STATUS).unwrap();
        assert_eq!(s.tgid, 13880);
        assert_eq!(s.ppid, 13877);
        assert_eq!(s.nspid, Some(vec![13881, 2]));
        assert_eq!(
            s.uid,
            Ids {
                real: 1000,
                effective: 1001,
                saved: 1002,
                fs: 1003
            }
        );
        assert_eq!(s.gid.fs, 103);
        assert_eq!(s.groups, [4, 24, 27]);
    }

    #[test]
    fn status_variants() {
        // Empty groups (tab + space, as the kernel prints it), no NSpid, a zombie, a Name with an
        // escaped newline that must not be read as a key.
        let s = parse_status(
            b"Name:\tevil\\nTgid:\t1\nState:\tZ (zombie)\nTgid:\t77\nPPid:\t0\n\
Uid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nGroups:\t \nTgid:\t99\n",
        )
        .unwrap();
        assert_eq!((s.tgid, s.ppid), (77, 0));
        assert_eq!(s.nspid, None);
        assert!(s.groups.is_empty());
        assert!(
            parse_status(b"Tgid:1\nPPid:2\nUid:1 1 1 1\nGid:2 2 2 2\nGroups:\nNSpid:\n")
                .is_ok_and(|s| s.nspid == Some(vec![]))
        );
    }

    #[test]
    fn status_errors() {
        let base = "Tgid:\t1\nPPid:\t0\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nGroups:\t\n";
        let cases: &[(String, &str)] = &[
            (String::new(), "/proc/<pid>/status: missing the Tgid: line"),
            (
                base.replace("PPid:\t0\n", ""),
                "/proc/<pid>/status: missing the PPid: line",
            ),
            (
                base.replace("Groups:\t\n", ""),
                "/proc/<pid>/status: missing the Groups: line",
            ),
            (
                base.replace("Uid:\t0\t0\t0\t0", "Uid:\t0\t0\t0"),
                "/proc/<pid>/status line 3: Uid: \"0\\t0\\t0\" is not four decimal ids",
            ),
            (
                base.replace("Gid:\t0\t0\t0\t0", "Gid:\t0\tx\t0\t0"),
                "/proc/<pid>/status line 4: Gid: \"x\" is not a decimal number",
            ),
            (
                base.replace("Tgid:\t1", "Tgid:\t"),
                "/proc/<pid>/status line 1: Tgid: \"\" is not a decimal number",
            ),
            (
                format!("{base}NSpid:\t5 -\n"),
                "/proc/<pid>/status line 6: NSpid: \"-\" is not a decimal number",
            ),
        ];
        for (input, want) in cases {
            let err = parse_status(input.as_bytes()).unwrap_err();
            assert_eq!(err.to_string(), *want, "{input:?}");
        }
    }

    #[test]
    fn cgroup_hybrid_fixture() {
        let c = parse_cgroup(
            b"9:name=systemd:/user.slice/session-2.scope\n8:pids:/\n2:cpu,cpuacct:/a:b\n\
4:memory:/process_api/2a9e\n0::/smithfs/smith-root/smith-001\n",
        )
        .unwrap();
        assert_eq!(c.v2, Some(PathBuf::from("/smithfs/smith-root/smith-001")));
        assert!(!c.v2_deleted);
        assert_eq!(c.v1.len(), 4);
        assert_eq!(c.v1[0].id, 9);
        assert_eq!(c.v1[0].name.as_deref(), Some("systemd"));
        assert!(c.v1[0].controllers.is_empty());
        assert_eq!(c.v1[0].path, PathBuf::from("/user.slice/session-2.scope"));
        assert_eq!(c.v1[2].controllers, ["cpu", "cpuacct"]);
        assert_eq!(c.v1[2].path, PathBuf::from("/a:b"));
        assert_eq!(c.v1[3].name, None);
    }

    #[test]
    fn cgroup_variants() {
        let c = parse_cgroup(b"0::/\n").unwrap();
        assert_eq!(c.v2, Some(PathBuf::from("/")));
        let c = parse_cgroup(b"0::/../sibling/x (deleted)\n").unwrap();
        assert_eq!(c.v2, Some(PathBuf::from("/../sibling/x")));
        assert!(c.v2_deleted);
        assert_eq!(parse_cgroup(b"").unwrap(), Cgroups::default());
        let c = parse_cgroup(b"1:name=systemd,cpu:/x").unwrap();
        assert_eq!(c.v2, None);
        assert_eq!(c.v1[0].controllers, ["cpu"]);
    }

    #[test]
    fn cgroup_errors() {
        let cases: &[(&[u8], &str)] = &[
            (
                b"0::/\n3:cpu\n",
                "/proc/<pid>/cgroup line 2: expected `hierarchy-id:controllers:path` (two `:`)",
            ),
            (
                b"x::/\n",
                "/proc/<pid>/cgroup line 1: hierarchy id: \"x\" is not a decimal number",
            ),
            (
                b"0::relative\n",
                "/proc/<pid>/cgroup line 1: path: \"relative\" is not a path starting with `/`",
            ),
            (
                b"0:cpu:/\n",
                "/proc/<pid>/cgroup line 1: controllers: \"cpu\" is not empty (hierarchy 0 is cgroup v2)",
            ),
            (
                b"0::/a\n0::/b\n",
                "/proc/<pid>/cgroup line 2: a second `0::` (cgroup v2) line",
            ),
        ];
        for (input, want) in cases {
            let err = parse_cgroup(input).unwrap_err();
            assert_eq!(
                err.to_string(),
                *want,
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn mountinfo_fixtures() {
        let m = parse_mountinfo_line(
            b"36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n",
        )
        .unwrap();
        assert_eq!((m.mount_id, m.parent_id, m.major, m.minor), (36, 35, 98, 0));
        assert_eq!(m.root, PathBuf::from("/mnt1"));
        assert_eq!(m.mount_point, PathBuf::from("/mnt2"));
        assert_eq!(m.mount_options, "rw,noatime");
        assert_eq!(m.optional_fields, ["master:1"]);
        assert_eq!(m.fs_type, "ext3");
        assert_eq!(m.source, OsString::from("/dev/root"));
        assert_eq!(m.super_options, "rw,errors=continue");
        assert!(!m.is_fuse());

        let m = parse_mountinfo_line(
            b"812 29 0:77 / /home/u/my\\040project/.agent-smith rw,nosuid,nodev,relatime shared:410 \
master:3 - fuse.smithfs smithfs rw,user_id=1000,group_id=1000,default_permissions",
        )
        .unwrap();
        assert_eq!(
            m.mount_point,
            PathBuf::from("/home/u/my project/.agent-smith")
        );
        assert_eq!(m.optional_fields, ["shared:410", "master:3"]);
        assert!(m.is_fuse() && m.is_smithfs());
        assert_eq!(m.fuse_subtype(), Some("smithfs"));

        // Plain `fuse` type named by its source; no optional fields; empty source; odd escapes.
        let m = parse_mountinfo_line(b"5 1 0:50 / /a\\011b\\012c\\134d\\9 rw - fuse smithfs rw")
            .unwrap();
        assert_eq!(m.mount_point.as_os_str().as_bytes(), b"/a\tb\nc\\d\\9");
        assert!(m.optional_fields.is_empty());
        assert!(m.is_smithfs() && m.fuse_subtype().is_none());
        let m = parse_mountinfo_line(b"5 1 0:50 / /x rw - tmpfs  rw").unwrap();
        assert_eq!(m.source, OsString::new());
        assert!(!m.is_smithfs());
        let m = parse_mountinfo_line(b"5 1 0:50 / /- rw - fuse.sshfs smithfs rw").unwrap();
        assert_eq!(m.mount_point, PathBuf::from("/-"));
        assert!(m.is_smithfs(), "source smithfs counts");
        let m = parse_mountinfo_line(b"5 1 0:50 / /x rw - fuse.other src rw").unwrap();
        assert!(m.is_fuse() && !m.is_smithfs());
    }

    #[test]
    fn mountinfo_file_and_errors() {
        let all = parse_mountinfo(
            b"22 27 0:21 / /proc rw,relatime - proc proc rw\n\
23 27 0:22 / /sys rw,relatime - sysfs sysfs rw\n",
        )
        .unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[1].mount_point, PathBuf::from("/sys"));
        assert_eq!(parse_mountinfo(b"").unwrap(), []);

        let cases: &[(&[u8], &str)] = &[
            (
                b"22 27 0:21 / /proc rw - proc proc rw\n23 27 0-22 / /sys rw - sysfs sysfs rw\n",
                "/proc/<pid>/mountinfo line 2: major:minor: \"0-22\" is not `major:minor`",
            ),
            (
                b"22 27 0:21 / /proc rw proc proc rw\n",
                "/proc/<pid>/mountinfo line 1: missing the `-` separator before the filesystem type",
            ),
            (
                b"22 27 0:21 / /proc rw - proc proc\n",
                "/proc/<pid>/mountinfo line 1: missing super options",
            ),
            (
                b"22 x 0:21 / /proc rw - proc proc rw\n",
                "/proc/<pid>/mountinfo line 1: parent id: \"x\" is not a decimal number",
            ),
            (b"22\n", "/proc/<pid>/mountinfo line 1: missing parent id"),
        ];
        for (input, want) in cases {
            let err = parse_mountinfo(input).unwrap_err();
            assert_eq!(
                err.to_string(),
                *want,
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
        assert_eq!(
            parse_mountinfo_line(b"22 27 0:x / /p rw - p p rw")
                .unwrap_err()
                .to_string(),
            "/proc/<pid>/mountinfo: major:minor: \"x\" is not a decimal number"
        );
    }

    #[test]
    fn unescape_table() {
        let cases: &[(&[u8], &[u8])] = &[
            (b"", b""),
            (b"plain", b"plain"),
            (b"\\040", b" "),
            (b"a\\040b\\040", b"a b "),
            (b"\\134", b"\\"),
            (b"\\377", b"\xff"),
            (b"\\400", b"\\400"),
            (b"\\08", b"\\08"),
            (b"\\04", b"\\04"),
            (b"\\", b"\\"),
            (b"\\\\040", b"\\ "),
        ];
        for (input, want) in cases {
            assert_eq!(
                unescape_octal(input),
                *want,
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn long_values_are_cut_in_messages() {
        let long = format!("Tgid:\t{}\n", "9".repeat(100));
        let msg = parse_status(long.as_bytes()).unwrap_err().to_string();
        assert!(msg.contains(&format!("\"{}…\"", "9".repeat(40))), "{msg}");
    }

    mod prop {
        use super::super::*;
        use proptest::prelude::*;
        use std::os::unix::ffi::OsStrExt;

        fn escape(path: &[u8]) -> Vec<u8> {
            let mut out = Vec::new();
            for b in path {
                match b {
                    b' ' | b'\t' | b'\n' | b'\\' => out.extend(format!("\\{b:03o}").bytes()),
                    other => out.push(*other),
                }
            }
            out
        }

        proptest! {
            #[test]
            fn no_parser_panics_on_bytes(input in proptest::collection::vec(any::<u8>(), 0..300)) {
                let _ = parse_stat(&input);
                let _ = parse_status(&input);
                let _ = parse_cgroup(&input);
                let _ = parse_mountinfo(&input);
                let _ = parse_mountinfo_line(&input);
                let _ = unescape_octal(&input);
            }

            #[test]
            fn no_parser_panics_on_any_string(input in ".*") {
                let b = input.as_bytes();
                let _ = parse_stat(b);
                let _ = parse_status(b);
                let _ = parse_cgroup(b);
                let _ = parse_mountinfo(b);
                let _ = parse_mountinfo_line(b);
            }

            #[test]
            fn no_parser_panics_on_strings(input in "[0-9a-zA-Z :()/\\\\\t\n,=-]{0,200}") {
                let b = input.as_bytes();
                let _ = parse_stat(b);
                let _ = parse_status(b);
                let _ = parse_cgroup(b);
                let _ = parse_mountinfo(b);
                if let Err(e) = parse_stat(b) {
                    prop_assert!(!e.to_string().is_empty());
                }
            }

            #[test]
            fn stat_round_trips_any_comm(
                pid in 1i32..,
                comm in proptest::collection::vec(1u8.., 0..32),
                ppid in 0i32..,
                starttime in any::<u64>(),
            ) {
                let line = super::stat_line(pid, &comm, 'S', ppid, starttime);
                let s = parse_stat(&line).unwrap();
                prop_assert_eq!(s.pid, pid);
                prop_assert_eq!(s.comm.as_bytes(), &comm[..]);
                prop_assert_eq!(s.ppid, ppid);
                prop_assert_eq!(s.starttime, starttime);
            }

            #[test]
            fn mount_point_round_trips(path in proptest::collection::vec(1u8.., 1..40)) {
                let mut line = b"1 2 0:3 / ".to_vec();
                line.extend(escape(&path));
                line.extend_from_slice(b" rw shared:1 - fuse.smithfs smithfs rw\n");
                let m = parse_mountinfo_line(&line).unwrap();
                prop_assert_eq!(m.mount_point.as_os_str().as_bytes(), &path[..]);
                prop_assert!(m.is_smithfs());
            }
        }
    }
}

/// A process that keeps a mount busy (for `umount` and the daemon's signal thread, issue 11).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// Its pid.
    pub pid: u32,
    /// Its command name (`/proc/PID/comm`).
    pub comm: String,
    /// What it holds: `cwd PATH`, `root PATH` or `file PATH`.
    pub what: String,
}

/// The processes whose working directory, root or an open descriptor is at or below `dir`,
/// from `/proc` (readlink only: nothing in the mount is touched). Processes `skip` are left out
/// (the daemon, which holds the store underneath at the same paths). Unreadable processes are
/// skipped.
pub fn mount_holders(dir: &std::path::Path, skip: &[u32]) -> Vec<Holder> {
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    let inside = |p: &std::path::Path| p.starts_with(dir);
    for e in procs.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if skip.contains(&pid) {
            continue;
        }
        let base = e.path();
        let comm = std::fs::read_to_string(base.join("comm"))
            .map(|c| c.trim().to_string())
            .unwrap_or_default();
        let mut found = None;
        for (link, word) in [("cwd", "cwd"), ("root", "root")] {
            if let Ok(t) = std::fs::read_link(base.join(link)) {
                if inside(&t) {
                    found = Some(format!("{word} {}", t.display()));
                    break;
                }
            }
        }
        if found.is_none() {
            if let Ok(fds) = std::fs::read_dir(base.join("fd")) {
                found = fds
                    .flatten()
                    .filter_map(|fd| std::fs::read_link(fd.path()).ok())
                    .find(|t| inside(t))
                    .map(|t| format!("file {}", t.display()));
            }
        }
        if let Some(what) = found {
            out.push(Holder { pid, comm, what });
        }
    }
    out.sort_by_key(|h| h.pid);
    out
}

/// `pid 12 (bash) cwd /m/x, pid 40 (less) file /m/y` — at most 10, then `… (N more)`; `no
/// process found (a kernel reference, or a process of another user)` when empty.
pub fn describe_holders(holders: &[Holder]) -> String {
    if holders.is_empty() {
        return "no process found (a kernel reference, or a process this user cannot see)".into();
    }
    let mut s = holders
        .iter()
        .take(10)
        .map(|h| format!("pid {} ({}) {}", h.pid, h.comm, h.what))
        .collect::<Vec<_>>()
        .join(", ");
    if holders.len() > 10 {
        s.push_str(&format!(" … ({} more)", holders.len() - 10));
    }
    s
}
