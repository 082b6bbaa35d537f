//! Helpers shared by subcommands: finding mounts, resolving DIR (docs/SPEC.md §6).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::policy::CtlAnswer;
use crate::sys::mount::{mounted_fs_type, mounts, FS_TYPE};
use crate::sys::procfs::MountInfo;

/// `bytes` as a terminal may show them: a run's output is the agent's to choose, and an escape
/// sequence in it would act on the operator's terminal (set its title, write its clipboard with
/// OSC 52, answer queries into its input). Control characters other than newline, tab and
/// carriage return are shown as `cat -v` shows them (`^[` for ESC, `^?` for DEL), the C1
/// controls (U+0080–U+009F, which some terminals obey too) as `\u{9b}`-style escapes, and the
/// bidirectional formatting characters by their code (`⟨U+202E⟩`, as the ui shows them, notes
/// UI12, H40: a terminal or an editor that applies them reorders a diff line before an accept);
/// everything else is passed through unchanged (notes O50).
pub(crate) fn terminal_safe(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b'\n' | b'\t' | b'\r' => out.push(b),
            0..=0x1f => out.extend_from_slice(&[b'^', b + 0x40]),
            0x7f => out.extend_from_slice(b"^?"),
            0xc2 if matches!(bytes.get(i + 1), Some(0x80..=0x9f)) => {
                out.extend_from_slice(format!("\\u{{{:02x}}}", bytes[i + 1]).as_bytes());
                i += 1;
            }
            0xd8 | 0xe2 => match bidi_at(&bytes[i..]) {
                Some(c) => {
                    out.extend_from_slice(bidi_code(c).as_bytes());
                    i += c.len_utf8() - 1;
                }
                None => out.push(b),
            },
            _ => out.push(b),
        }
        i += 1;
    }
    out
}

/// The bidirectional formatting character `bytes` start with, if they do (UTF-8). Pure.
fn bidi_at(bytes: &[u8]) -> Option<char> {
    let len = if bytes.first() == Some(&0xd8) { 2 } else { 3 };
    let c = std::str::from_utf8(bytes.get(..len)?)
        .ok()?
        .chars()
        .next()?;
    crate::ui::html::is_bidi_control(c).then_some(c)
}

/// How a bidirectional formatting character is shown: `⟨U+202E⟩` (notes H40). Pure.
pub(crate) fn bidi_code(c: char) -> String {
    format!("\u{27e8}U+{:04X}\u{27e9}", c as u32)
}

/// `s` on one line of a terminal: as [`terminal_safe`], and newline, tab and carriage return
/// shown as `^J`, `^I`, `^M` too — for a value a smith chose that the operator's command prints
/// inside a line of its own (a run's error in `status`, git's error line in `diff`; notes O51).
pub(crate) fn inline_safe(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\0'..='\u{1f}' => {
                out.push('^');
                out.push(char::from(c as u8 + 0x40));
            }
            '\u{7f}' => out.push_str("^?"),
            '\u{80}'..='\u{9f}' => out.push_str(&format!("\\u{{{:02x}}}", c as u32)),
            c if crate::ui::html::is_bidi_control(c) => out.push_str(&bidi_code(c)),
            _ => out.push(c),
        }
    }
    out
}

/// Write `bytes` to standard output, [`terminal_safe`] when it is a terminal (what a smith wrote,
/// printed for the operator: `logs`, `diff`).
///
/// # Errors
/// The write's.
pub(crate) fn print_untrusted(bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if std::io::IsTerminal::is_terminal(&out) {
        out.write_all(&terminal_safe(bytes))?;
    } else {
        out.write_all(bytes)?;
    }
    out.flush()
}

/// What is mounted at a directory, as far as smithfs cares.
#[derive(Debug, PartialEq, Eq)]
pub enum MountState {
    /// Nothing is mounted there.
    NotMounted,
    /// A live smithfs mount.
    Live,
    /// A smithfs mount whose daemon is gone (stat gives ENOTCONN).
    Dead,
    /// Something else is mounted there.
    Other(String),
}

/// What is mounted at `dir`.
pub fn mount_state(dir: &Path) -> MountState {
    match mounted_fs_type(dir) {
        None => MountState::NotMounted,
        // opendir always reaches the daemon (stat may be answered from the kernel's cache).
        // Over io_uring a request caught while the kernel tears a dead daemon's rings down
        // ends with ECONNABORTED or ECANCELED instead of ENOTCONN (PROTOCOL-NOTES U3).
        Some(t) if t == FS_TYPE => match std::fs::read_dir(dir) {
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED)
                ) =>
            {
                MountState::Dead
            }
            _ => MountState::Live,
        },
        Some(t) => MountState::Other(t),
    }
}

/// Make `dir` absolute without touching a possibly dead mount at `dir` itself.
pub fn absolute(dir: &Path) -> Result<PathBuf> {
    let abs = if dir.is_absolute() {
        dir.to_path_buf()
    } else {
        std::env::current_dir()
            .context("cannot read the working directory")?
            .join(dir)
    };
    let parent = abs.parent().map(Path::to_path_buf);
    let name = abs.file_name().map(|n| n.to_os_string());
    match (parent, name) {
        (Some(p), Some(n)) => {
            let p = p
                .canonicalize()
                .with_context(|| format!("{}: no such directory", p.display()))?;
            Ok(p.join(n))
        }
        _ => {
            if abs == Path::new("/") {
                bail!("refusing to use / as a smithfs directory");
            }
            Ok(abs)
        }
    }
}

/// The smithfs mount whose mount point is the deepest one containing `cwd` (pure): a FUSE mount
/// whose subtype or source is `smithfs`.
pub fn nearest_mount(mounts: &[MountInfo], cwd: &Path) -> Option<PathBuf> {
    mounts
        .iter()
        .filter(|m| m.is_smithfs() && cwd.starts_with(&m.mount_point))
        .max_by_key(|m| m.mount_point.components().count())
        .map(|m| m.mount_point.clone())
}

/// Where a subcommand's mount is (docs/SPEC.md §6): `explicit` (made absolute; a directory inside
/// a smithfs mount means that mount), else the nearest
/// smithfs mount above the working directory, else `$SMITH_MOUNT`, else `./.agent-smith`. Whether
/// a mount is live there is not checked: `status`, `events`, `wait` and `cancel` read and write
/// `DIR/.smithfs/` and say so when they cannot; [`find_mount`] also checks.
///
/// # Errors
/// The working directory cannot be read, or the parent of `explicit` does not exist.
pub fn resolve_mount(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(dir) = explicit {
        // A directory inside a mount names that mount (`smithfs status DIR/smiths`).
        let dir = absolute(dir)?;
        if mounted_fs_type(&dir).is_none() {
            if let Some(m) = nearest_mount(&mounts(), &dir) {
                return Ok(m);
            }
        }
        return Ok(dir);
    }
    let cwd = std::env::current_dir().context("cannot read the working directory")?;
    if let Some(m) = nearest_mount(&mounts(), &cwd) {
        return Ok(m);
    }
    if let Some(env) = std::env::var_os("SMITH_MOUNT").filter(|v| !v.is_empty()) {
        return absolute(Path::new(&env));
    }
    Ok(cwd.join(".agent-smith"))
}

/// `DIR/.smithfs/NAME`, the control file `name` of the mount `dir` (docs/SPEC.md §7).
///
/// # Errors
/// The file does not exist and `dir` is not a live smithfs mount: the one-line reason of
/// `check_live` (not mounted, a dead daemon, another filesystem).
pub fn control_file(dir: &Path, name: &str) -> Result<PathBuf> {
    let path = dir.join(".smithfs").join(name);
    if !path.exists() {
        check_live(dir)?;
    }
    Ok(path)
}

/// [`resolve_mount`], which must be a live smithfs mount (`whoami`, `run`).
///
/// # Errors
/// Not a live smithfs mount (not mounted, something else, or a dead daemon), or none was found;
/// each a one-line message naming what was tried.
pub fn find_mount(explicit: Option<&Path>) -> Result<PathBuf> {
    let dir = resolve_mount(explicit)?;
    let implicit = explicit.is_none()
        && !std::env::var_os("SMITH_MOUNT").is_some_and(|v| !v.is_empty())
        && dir.ends_with(".agent-smith");
    match mount_state(&dir) {
        MountState::NotMounted if implicit => bail!(
            "no smithfs mount found: none above {}, $SMITH_MOUNT is unset and ./.agent-smith is not \
             mounted (use --mount DIR)",
            dir.parent().unwrap_or(&dir).display()
        ),
        _ => check_live(&dir),
    }
}

/// The live mount for a command that acts on a smith (`cancel`, `retry`): [`resolve_mount`]
/// of `explicit`, which must be live, and the full id `query` names there (docs/SPEC.md §6).
///
/// # Errors
/// Not a live mount (one line), or an ambiguous or unknown id
/// ([`super::ids::UsageError`], exit 2).
pub fn mount_and_id(explicit: Option<&Path>, query: &str) -> Result<(PathBuf, String)> {
    let dir = resolve_mount(explicit)?;
    let src = super::store::source(&dir)?;
    let full = super::store::resolve_id(&src, query)?;
    if matches!(src, super::store::Source::Store(_)) {
        bail!("{} is not mounted: mount it first", dir.display());
    }
    Ok((dir, full))
}

/// Write the command `line` to `dir/.smithfs/ctl` in one `write` (docs/SPEC.md §7). `verb` and
/// `full` name the command in errors.
///
/// # Errors
/// One line: not allowed (EACCES/EPERM), no such smith (a [`super::ids::UsageError`]), the
/// daemon's reason from `.smithfs/why` for a refused command, or the I/O error.
pub fn ctl(dir: &Path, line: &str, verb: &str, full: &str) -> Result<()> {
    use std::io::Write;
    let ctl = control_file(dir, "ctl")?;
    let result = std::fs::OpenOptions::new()
        .write(true)
        .open(&ctl)
        .and_then(|mut f| {
            f.write_all(format!("{line}\n").as_bytes())?;
            f.flush()
        });
    let Err(e) = result else {
        return Ok(());
    };
    match CtlAnswer::of(&e) {
        CtlAnswer::NotAllowed => bail!(
            "not allowed to {verb} {full}: only the operator or an ancestor smith may (see {}/.smithfs/why)",
            dir.display()
        ),
        CtlAnswer::NoSuchSmith if ctl.exists() => {
            super::ids::usage!("no such smith {full} in {}", dir.display())
        }
        CtlAnswer::NoSuchSmith => bail!(
            "cannot open {} (is {} a live smithfs mount?)",
            ctl.display(),
            dir.display()
        ),
        answer @ (CtlAnswer::Refused | CtlAnswer::Other) => {
            let why = std::fs::read_to_string(dir.join(".smithfs/why")).unwrap_or_default();
            match why.lines().find(|l| !l.trim().is_empty()) {
                Some(first) if answer == CtlAnswer::Refused => {
                    bail!("cannot {verb} {full}: {}", first.trim())
                }
                _ => bail!("cannot {verb} {full}: {e}"),
            }
        }
    }
}

/// `dir` as a live smithfs mount, or the one-line reason it is not (not mounted, another
/// filesystem, or a dead daemon).
fn check_live(dir: &Path) -> Result<PathBuf> {
    match mount_state(dir) {
        MountState::Live => Ok(dir.to_path_buf()),
        MountState::Dead => bail!(
            "{}: the smithfs daemon is gone (dead mount); remount it",
            dir.display()
        ),
        MountState::NotMounted => bail!("{} is not a smithfs mount", dir.display()),
        MountState::Other(t) => bail!("{} is a {t} mount, not smithfs", dir.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_sequences_reach_a_terminal_as_text() {
        let cases: &[(&[u8], &[u8])] = &[
            (b"plain text\n", b"plain text\n"),
            (b"tab\tcr\r\n", b"tab\tcr\r\n"),
            (b"A\x1b]0;TITLE\x07B", b"A^[]0;TITLE^GB"),
            (b"\x1b]52;c;ZWNobw==\x07", b"^[]52;c;ZWNobw==^G"),
            (b"\x1b[31mred\x1b[0m", b"^[[31mred^[[0m"),
            (b"del\x7f", b"del^?"),
            ("csi \u{9b}31m".as_bytes(), b"csi \\u{9b}31m"),
            (
                "caf\u{e9} \u{2713}".as_bytes(),
                "caf\u{e9} \u{2713}".as_bytes(),
            ),
            // Trojan Source in a diff line (notes H40): every bidi control by its code; other
            // characters of the same lead bytes (U+0600s, U+2000s) pass; a torn one passes.
            (
                "+if (a) { /*\u{202e} } \u{2066}if (admin)\u{2069} \u{2067}{\u{2069} */\n".as_bytes(),
                "+if (a) { /*\u{27e8}U+202E\u{27e9} } \u{27e8}U+2066\u{27e9}if (admin)\u{27e8}U+2069\u{27e9} \u{27e8}U+2067\u{27e9}{\u{27e8}U+2069\u{27e9} */\n".as_bytes(),
            ),
            (
                "\u{61c}\u{200e}\u{200f}\u{202a}\u{2014}\u{600}".as_bytes(),
                "\u{27e8}U+061C\u{27e9}\u{27e8}U+200E\u{27e9}\u{27e8}U+200F\u{27e9}\u{27e8}U+202A\u{27e9}\u{2014}\u{600}".as_bytes(),
            ),
            (b"torn \xe2\x80", b"torn \xe2\x80"),
        ];
        for (input, want) in cases {
            assert_eq!(
                terminal_safe(input),
                want.to_vec(),
                "{}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn inline_values_stay_on_their_line() {
        for (input, want) in [
            ("exit 1", "exit 1"),
            ("a\nT run.exited\tb\r", "a^JT run.exited^Ib^M"),
            ("\u{1b}]52;c;eA==\u{7}", "^[]52;c;eA==^G"),
            ("del\u{7f} csi \u{9b}", "del^? csi \\u{9b}"),
            ("caf\u{e9}", "caf\u{e9}"),
            ("run \u{202e}gol.md", "run \u{27e8}U+202E\u{27e9}gol.md"),
        ] {
            assert_eq!(inline_safe(input), want, "{input:?}");
        }
    }

    use crate::sys::procfs::parse_mountinfo;

    #[test]
    fn nearest_mount_table() {
        let mounts = parse_mountinfo(
            b"1 0 0:1 / / rw - ext4 /dev/root rw\n\
2 1 0:50 / /w/a rw,nosuid,nodev - fuse.smithfs smithfs rw,user_id=0\n\
3 2 0:51 / /w/a/smiths/x rw - fuse smithfs rw\n\
4 1 0:52 / /w/b rw - fuse.sshfs host:/ rw\n\
5 1 0:53 / /w/c\\040d rw - fuse.smithfs smithfs rw\n",
        )
        .expect("fixture");
        let rows: &[(&str, Option<&str>)] = &[
            ("/w/a", Some("/w/a")),
            ("/w/a/smiths/smith-root/private", Some("/w/a")),
            ("/w/a/smiths/x/y", Some("/w/a/smiths/x")),
            ("/w/ab", None),
            ("/w/b/z", None),
            ("/w/c d/e", Some("/w/c d")),
            ("/", None),
        ];
        for (cwd, want) in rows {
            assert_eq!(
                nearest_mount(&mounts, Path::new(cwd)),
                want.map(PathBuf::from),
                "{cwd}"
            );
        }
    }
}
