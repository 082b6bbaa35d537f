//! The start-up scan: rebuild the smith registry from the store (docs/SPEC.md §1, §9). A directory
//! is a smith dir when it is `smiths/smith-root` or a validly named directory in a registered
//! smith's `children/`.

use std::collections::HashMap;
use std::ffi::{CStr, CString, OsStr};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::backing::{self, BackingIno, SysResult};
use crate::tree::model::SmithIdx;
use crate::tree::model::{parse_child_name, FullId, ROOT_ID};
use crate::tree::registry::Registry;

/// The file in `.smithfs-state/` that remembers each smith's highest child number.
pub const CHILDREN_FILE: &str = "children.json";

/// Register every smith dir under `root` (the store's root) in `registry`. `highest` is the
/// remembered highest child number per full id (from [`CHILDREN_FILE`]).
pub fn scan(
    root: BorrowedFd<'_>,
    registry: &Registry,
    highest: &HashMap<String, u32>,
) -> SysResult<()> {
    let smiths = match backing::open_dir_path(root, Path::new("smiths")) {
        Ok(f) => f,
        Err(nix::errno::Errno::ENOENT) => return Ok(()),
        Err(e) => return Err(e),
    };
    let root_name = backing::component(OsStr::new(ROOT_ID))?;
    let Ok(st) = backing::stat_at(smiths.as_fd(), &root_name) else {
        return Ok(());
    };
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return Ok(());
    }
    let Some(idx) = registry.register(
        None,
        ROOT_ID,
        BackingIno::of(&st),
        highest.get(ROOT_ID).copied(),
    ) else {
        return Ok(());
    };
    let dir = backing::open_beneath(
        smiths.as_fd(),
        &root_name,
        libc::O_PATH | libc::O_DIRECTORY,
        0,
    )?;
    scan_children(dir.as_fd(), idx, registry, highest)
}

/// Why a moved smith dir could not be registered ([`scan_moved`]); logged, never a reply.
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    /// A system call on the store failed (ENOTDIR: the entry is not a directory).
    #[error("{0}")]
    Backing(#[from] nix::errno::Errno),
    /// The name is no child name of the new parent (not UTF-8, or the parent is unknown).
    #[error("not a child name of its new parent")]
    BadName,
    /// The registry refused the smith (its parent is gone, or the name is taken).
    #[error("the registry refused it")]
    NotRegistered,
}

/// Register the directory `name` in the `children/` directory `children` as the child `name` of
/// `parent`, and every smith dir below it, as the start-up scan would (a smith dir the operator
/// moved into that `children/`, docs/PROTOCOL-NOTES.md, C35). `highest` gives remembered
/// highest child numbers by the new full ids. Returns the new smith's index; the caller has
/// checked the name.
pub fn scan_moved(
    children: BorrowedFd<'_>,
    name: &CStr,
    parent: SmithIdx,
    registry: &Registry,
    highest: &HashMap<String, u32>,
) -> Result<SmithIdx, ScanError> {
    // O_DIRECTORY: the kernel answers ENOTDIR for anything else.
    let dir = backing::open_beneath(children, name, libc::O_PATH | libc::O_DIRECTORY, 0)?;
    let st = backing::stat(dir.as_fd())?;
    let id = name.to_str().map_err(|_| ScanError::BadName)?;
    let full = registry
        .full_id(parent)
        .and_then(|p| p.child(id))
        .ok_or(ScanError::BadName)?;
    let idx = registry
        .register(
            Some(parent),
            id,
            BackingIno::of(&st),
            highest.get(full.as_str()).copied(),
        )
        .ok_or(ScanError::NotRegistered)?;
    scan_children(dir.as_fd(), idx, registry, highest)?;
    Ok(idx)
}

fn scan_children(
    smith_dir: BorrowedFd<'_>,
    parent: SmithIdx,
    registry: &Registry,
    highest: &HashMap<String, u32>,
) -> SysResult<()> {
    let Ok(children) = backing::open_dir_path(smith_dir, Path::new("children")) else {
        return Ok(());
    };
    let mut found = Vec::new();
    {
        let mut stream = backing::DirStream::open(children.as_fd())?;
        while let Some(e) = stream.next_entry()? {
            if let Some(n) = parse_child_name(OsStr::from_bytes(&e.name)) {
                found.push((n, e.name));
            }
        }
    }
    found.sort();
    for (n, name) in found {
        let c = backing::component(OsStr::from_bytes(&name))?;
        let Ok(st) = backing::stat_at(children.as_fd(), &c) else {
            continue;
        };
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            continue;
        }
        registry.note_child_number(parent, n);
        let id = String::from_utf8_lossy(&name).into_owned();
        let Some(full) = registry.full_id(parent).and_then(|p| p.child(&id)) else {
            continue;
        };
        let Some(idx) = registry.register(
            Some(parent),
            &id,
            BackingIno::of(&st),
            highest.get(full.as_str()).copied(),
        ) else {
            continue;
        };
        let dir = backing::open_beneath(children.as_fd(), &c, libc::O_PATH | libc::O_DIRECTORY, 0)?;
        scan_children(dir.as_fd(), idx, registry, highest)?;
    }
    Ok(())
}

/// Remove what a crashed daemon left under its temporary names ([`backing::is_daemon_temp`]): a
/// half-built smith dir in a `children/`, a half-written `results/final.md`, `meta.json` or
/// state file (docs/SPEC.md §4, §9). Looks in the store's root, `results/`, `.smithfs-state/`, and
/// each registered smith's `children/` and `conversations/<run-id>/`. Call it once at start-up,
/// after [`scan`] and before the mount is served or the scheduler starts: later, a temporary name
/// may be a scaffold or a write in progress. Returns how many entries were removed; an entry
/// that cannot be removed is left (it is never visible through the mount anyway).
pub fn remove_crash_leftovers(root: BorrowedFd<'_>, registry: &Registry) -> usize {
    let mut dirs = vec![
        String::new(),
        "results".to_owned(),
        crate::tree::layout::STATE_DIR.to_owned(),
    ];
    for info in registry.all() {
        let rel = info.rel_dir();
        dirs.push(format!("{rel}/children"));
        if let Ok(runs) = backing::open_dir_path(root, Path::new(&format!("{rel}/conversations"))) {
            dirs.extend(
                backing::dir_names(runs.as_fd())
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|n| !backing::is_daemon_temp(n))
                    .map(|n| format!("{rel}/conversations/{}", String::from_utf8_lossy(&n))),
            );
        }
    }
    let mut removed = 0;
    for rel in dirs {
        let dir = if rel.is_empty() {
            backing::open_beneath(root, c".", libc::O_PATH | libc::O_DIRECTORY, 0)
        } else {
            backing::open_dir_path(root, Path::new(&rel))
        };
        let Ok(dir) = dir else {
            continue;
        };
        for name in backing::dir_names(dir.as_fd()).unwrap_or_default() {
            if !backing::is_daemon_temp(&name) {
                continue;
            }
            let Ok(c) = CString::new(name) else {
                continue;
            };
            match backing::remove_tree(dir.as_fd(), &c) {
                Ok(()) => removed += 1,
                Err(e) => tracing::warn!("cannot remove the leftover {rel}/{c:?}: {e}"),
            }
        }
    }
    removed
}

/// Read [`CHILDREN_FILE`] from the state dir (empty when absent or unreadable).
pub fn load_highest(state: BorrowedFd<'_>) -> HashMap<String, u32> {
    backing::read_file(state, Path::new(CHILDREN_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Write [`CHILDREN_FILE`] atomically.
pub fn save_highest(state: BorrowedFd<'_>, registry: &Registry) -> SysResult<()> {
    let map: std::collections::BTreeMap<FullId, u32> =
        registry.highest_children().into_iter().collect();
    let text = serde_json::to_vec_pretty(&map).unwrap_or_default();
    let name = backing::component(OsStr::new(CHILDREN_FILE))?;
    backing::write_atomic(state, &name, &text, 0o600)
}
