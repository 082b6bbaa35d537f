//! `$PATH` searched as execvp(3) searches it: the one search of the daemon and the command line
//! (`fusermount3` for `mount` and `doctor`, the Slurm commands for `doctor`, the keeper's
//! COMMAND). The child side of `process::spawn` keeps its own list of candidates, tried by
//! `execve` itself between `clone3` and exec, where nothing may allocate.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// `$PATH` when it is unset: glibc's execvp default (`process::spawn` uses the same).
pub const DEFAULT_PATH: &str = "/bin:/usr/bin";

/// The file execvp(3) would run for `program` with the process's `$PATH` ([`DEFAULT_PATH`] if
/// unset) and working directory: see [`find_program_in`].
pub fn find_program(program: &OsStr) -> Option<PathBuf> {
    let path = std::env::var_os("PATH");
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    find_program_in(
        program,
        path.as_deref().unwrap_or(OsStr::new(DEFAULT_PATH)),
        &cwd,
    )
}

/// The file execvp(3) would run for `program` with `$PATH` `path` in working directory `cwd`:
/// `program` itself, unchecked, when it has a `/` (exec answers for it); `None` when it is
/// empty; else the first entry of `path` (`:`-separated; an empty entry is `cwd`, a relative
/// one is relative to `cwd`, as for execvp) where `program` is a regular file (a symlink is
/// followed) that this process may execute (`access(X_OK)`: for root, any execute bit). A
/// directory or a file without the right is passed over, as execvp passes it over.
pub fn find_program_in(program: &OsStr, path: &OsStr, cwd: &Path) -> Option<PathBuf> {
    if program.is_empty() {
        return None;
    }
    if program.as_bytes().contains(&b'/') {
        return Some(PathBuf::from(program));
    }
    path.as_bytes()
        .split(|b| *b == b':')
        .map(|dir| cwd.join(OsStr::from_bytes(dir)).join(program))
        .find(|c| is_executable(c))
}

/// `p` is a regular file (through symlinks) this process may execute.
fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file())
        && rustix::fs::access(p, rustix::fs::Access::EXEC_OK).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// One row per rule: the search's answer for PROGRAM with PATH in a directory of
    /// executables, non-executables, directories and links (`%` stands for that directory).
    #[test]
    fn finds_what_execvp_would_run() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let d = tmp.path();
        let file = |rel: &str, mode: u32| {
            let p = d.join(rel);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(&p, "#!/bin/sh\n").expect("write");
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).expect("chmod");
        };
        file("a/tool", 0o755);
        file("b/tool", 0o755);
        file("plain/tool", 0o644);
        std::fs::create_dir_all(d.join("dir/tool")).expect("mkdir");
        std::fs::create_dir_all(d.join("link")).expect("mkdir");
        std::os::unix::fs::symlink(d.join("a/tool"), d.join("link/tool")).expect("symlink");
        // A file with no execute bit at all is passed over by root too.
        let rows: &[(&str, &str, Option<&str>)] = &[
            ("tool", "%/a:%/b", Some("%/a/tool")),
            ("tool", "%/b:%/a", Some("%/b/tool")),
            ("tool", "%/missing:%/b", Some("%/b/tool")),
            // Not executable, a directory: passed over.
            ("tool", "%/plain:%/b", Some("%/b/tool")),
            ("tool", "%/dir:%/b", Some("%/b/tool")),
            ("tool", "%/plain:%/dir", None),
            // A symlink to an executable is one.
            ("tool", "%/link", Some("%/link/tool")),
            // Empty entries (leading, inner, trailing; a PATH of "") are the working directory
            // (here `%/a`); a relative entry is relative to it.
            ("tool", ":%/b", Some("%/a/tool")),
            ("tool", "%/missing::%/b", Some("%/a/tool")),
            ("tool", "%/missing:", Some("%/a/tool")),
            ("tool", "", Some("%/a/tool")),
            ("tool", "../b", Some("%/a/../b/tool")),
            ("tool", "../plain:../missing", None),
            // A `/` in the name: the name itself, not searched; an empty name: nothing.
            ("./x/tool", "%/a", Some("./x/tool")),
            ("/no/such", "%/a", Some("/no/such")),
            ("", "%/a", None),
            ("nothing", "%/a:%/b", None),
        ];
        let cwd = d.join("a");
        let pct = d.to_string_lossy();
        let mut failed = Vec::new();
        for (program, path, want) in rows {
            let path = path.replace('%', &pct);
            let got = find_program_in(OsStr::new(program), OsStr::new(&path), &cwd);
            let want = want.map(|w| PathBuf::from(w.replace('%', &pct)));
            if got != want {
                failed.push(format!("{program:?} in {path:?}: {got:?}, not {want:?}"));
            }
        }
        assert!(failed.is_empty(), "{failed:#?}");
    }
}
