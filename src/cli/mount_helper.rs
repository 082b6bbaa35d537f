//! `mount.fuse.smithfs SOURCE DIR [-o OPTS] [-n] [-s] [-v] [-f] [-t TYPE]`: what mount(8) runs
//! for an fstab line of type `fuse.smithfs` (docs/SPEC.md §6). It is this binary under another
//! name (a symlink, `scripts/install.sh`), translated to `smithfs mount DIR -o OPTS`
//! (docs/PROTOCOL-NOTES.md O41). SOURCE is `smithfs` or DIR itself: a smithfs mount is always
//! the directory over itself.

use std::ffi::{OsStr, OsString};
use std::path::Path;

use super::ids::UsageError;
use crate::sys::mount::{FS_NAME, FS_TYPE};

/// The helper's file name: mount(8) looks for `/sbin/mount.fuse.smithfs` (and `/sbin/mount.fuse`
/// would look for `smithfs` on PATH, which is the binary itself).
pub const NAME: &str = "mount.fuse.smithfs";

/// Whether the process was started as the helper (by `argv[0]`'s file name).
pub fn invoked_as_helper(argv0: &OsStr) -> bool {
    Path::new(argv0).file_name() == Some(OsStr::new(NAME))
}

/// What mount(8) asked for.
#[derive(Debug, PartialEq, Eq)]
pub struct HelperCall {
    /// The fstab source field.
    pub source: OsString,
    /// The mount point.
    pub dir: OsString,
    /// Every `-o` list, in order.
    pub options: Vec<OsString>,
    /// `-f`: "fake", do everything but mount (mount(8)'s `-f`): nothing to do.
    pub fake: bool,
}

/// Parse the helper's arguments (after `argv[0]`) the way mount(8) passes them: two positionals
/// and options before, between or after them.
///
/// # Errors
/// A usage line: a missing or extra positional, `-o`/`-t` without a value, a type other than
/// `fuse.smithfs`, an unknown flag.
pub fn parse(args: &[OsString]) -> Result<HelperCall, UsageError> {
    let usage = || format!("usage: {NAME} SOURCE DIR [-o OPT[,OPT…]] (SOURCE is `smithfs` or DIR)");
    let mut pos = Vec::new();
    let mut options = Vec::new();
    let mut fake = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let s = a.to_string_lossy();
        match s.as_ref() {
            "-o" | "-t" => {
                let v = it
                    .next()
                    .ok_or_else(|| UsageError(format!("{NAME}: {s} needs a value; {}", usage())))?;
                if s == "-o" {
                    options.push(v.clone());
                } else {
                    check_type(&v.to_string_lossy())?;
                }
            }
            // mount(8): no mtab, sloppy, verbose — nothing for us to do differently.
            "-n" | "-s" | "-v" => {}
            "-f" => fake = true,
            o if o.starts_with("-o") => options.push(OsString::from(&o[2..])),
            o if o.starts_with("-t") => check_type(&o[2..])?,
            o if o.starts_with('-') && o.len() > 1 => {
                return Err(UsageError(format!("{NAME}: unknown flag {o}; {}", usage())))
            }
            _ => pos.push(a.clone()),
        }
    }
    let [source, dir]: [OsString; 2] = pos
        .try_into()
        .map_err(|_| UsageError(format!("{NAME}: {}", usage())))?;
    Ok(HelperCall {
        source,
        dir,
        options,
        fake,
    })
}

fn check_type(t: &str) -> Result<(), UsageError> {
    match t {
        FS_TYPE | FS_NAME => Ok(()),
        other => Err(UsageError(format!(
            "{NAME}: type {other}: this helper mounts {FS_TYPE} only"
        ))),
    }
}

impl HelperCall {
    /// The equivalent `smithfs mount DIR -o OPTS…` command line (with `argv[0]` `smithfs`), or
    /// `None` for a fake mount.
    ///
    /// # Errors
    /// SOURCE is neither `smithfs` nor DIR (`same` decides whether two paths name one directory).
    pub fn to_mount_argv(
        &self,
        same: impl Fn(&Path, &Path) -> bool,
    ) -> Result<Option<Vec<OsString>>, UsageError> {
        if self.source != FS_NAME && !same(Path::new(&self.source), Path::new(&self.dir)) {
            return Err(UsageError(format!(
                "{NAME}: source {} is not the mount point {}: a smithfs fstab line names the directory twice, or `smithfs` as the source",
                Path::new(&self.source).display(),
                Path::new(&self.dir).display()
            )));
        }
        if self.fake {
            return Ok(None);
        }
        let mut argv: Vec<OsString> = vec!["smithfs".into(), "mount".into(), self.dir.clone()];
        for o in &self.options {
            argv.push("-o".into());
            argv.push(o.clone());
        }
        Ok(Some(argv))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn recognises_its_name() {
        assert!(invoked_as_helper(OsStr::new("/sbin/mount.fuse.smithfs")));
        assert!(invoked_as_helper(OsStr::new("mount.fuse.smithfs")));
        assert!(!invoked_as_helper(OsStr::new("/usr/local/bin/smithfs")));
        assert!(!invoked_as_helper(OsStr::new("mount.fuse")));
    }

    #[test]
    fn parses_what_mount8_passes() {
        let same = |a: &Path, b: &Path| a == b;
        let table: &[(&[&str], Option<&[&str]>)] = &[
            // What util-linux 2.38 passes for `defaults,nofail,allow_other` (measured).
            (
                &["smithfs", "/srv/f", "-o", "rw,allow_other,nofail"],
                Some(&["smithfs", "mount", "/srv/f", "-o", "rw,allow_other,nofail"]),
            ),
            (&["/srv/f", "/srv/f"], Some(&["smithfs", "mount", "/srv/f"])),
            (
                &[
                    "-n",
                    "-orw",
                    "smithfs",
                    "-s",
                    "/srv/f",
                    "-v",
                    "-t",
                    "fuse.smithfs",
                    "-o",
                    "resume",
                ],
                Some(&["smithfs", "mount", "/srv/f", "-o", "rw", "-o", "resume"]),
            ),
            (&["smithfs", "/srv/f", "-f"], None),
        ];
        for (a, want) in table {
            let got = parse(&args(a)).unwrap().to_mount_argv(same).unwrap();
            assert_eq!(got, want.map(args), "{a:?}");
        }
    }

    #[test]
    fn refuses_with_one_line() {
        let same = |a: &Path, b: &Path| a == b;
        for (a, want) in [
            (&["smithfs"][..], "usage: mount.fuse.smithfs SOURCE DIR"),
            (&["a", "b", "c"][..], "usage:"),
            (&["smithfs", "/d", "-o"][..], "-o needs a value"),
            (
                &["smithfs", "/d", "-t", "fuse.sshfs"][..],
                "type fuse.sshfs",
            ),
            (&["smithfs", "/d", "-x"][..], "unknown flag -x"),
        ] {
            let e = parse(&args(a)).unwrap_err().0;
            assert!(e.contains(want) && !e.contains('\n'), "{a:?}: {e}");
        }
        let e = parse(&args(&["/other", "/d"]))
            .unwrap()
            .to_mount_argv(same)
            .unwrap_err()
            .0;
        assert!(e.contains("source /other is not the mount point /d"), "{e}");
    }
}
