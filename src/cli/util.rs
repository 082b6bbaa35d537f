//! Helpers shared by subcommands: finding mounts, resolving DIR.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// The FUSE filesystem type smithfs mounts as (`fuse.smithfs` in mountinfo).
pub const FS_TYPE: &str = "fuse.smithfs";

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

/// Decode the octal escapes (`\040` …) mountinfo uses in paths.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The filesystem type mounted at exactly `dir` (the topmost mount), if any.
pub fn mounted_fs_type(dir: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = dir.to_string_lossy();
    let mut found = None;
    for line in info.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        if fields.len() < 10 {
            continue;
        }
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        if unescape(fields[4]) == want {
            let fstype = fields.get(sep + 1).copied().unwrap_or("");
            let source = fields.get(sep + 2).copied().unwrap_or("");
            found = Some(if fstype.starts_with("fuse") && source == "smithfs" {
                FS_TYPE.to_string()
            } else {
                fstype.to_string()
            });
        }
    }
    found
}

/// What is mounted at `dir`.
pub fn mount_state(dir: &Path) -> MountState {
    match mounted_fs_type(dir) {
        None => MountState::NotMounted,
        // opendir always reaches the daemon (stat may be answered from the kernel's cache).
        Some(t) if t == FS_TYPE => match std::fs::read_dir(dir) {
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTCONN | libc::ECONNABORTED)) => {
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
