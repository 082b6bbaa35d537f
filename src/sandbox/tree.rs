//! The tree side of the sandbox (docs/SPEC.md §1, §3, §4, §12): `home/` seeded from
//! `templates/home/`, and the ownership of what smiths may write.
//!
//! Everything here works on store paths (the store root as `/proc/self/fd/N/...`, so it reaches
//! the backing store also while the mount covers it), never follows a symlink it finds in the
//! tree (`lchown`, `symlink_metadata`), and is done by the daemon as root.

use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use crate::tree::model::{parse_child_name, FullId};

use super::AgentUser;

/// The area every smith dir has for its agent CLI's `HOME` (docs/SPEC.md §1).
pub const HOME: &str = "home";

/// The seed of every new smith's `home/`, relative to the mount root (operator-only, §3).
pub const TEMPLATES_HOME: &str = "templates/home";

/// What a smith's runs never own: `conversations/` is written by smithfs alone (§3).
pub const DAEMON_OWNED: &str = "conversations";

/// The file in `.smithfs-state/` saying which uid the tree was last brought over to.
pub const OWNED_MARK: &str = "agents-owned";

/// Copy the directory `src` into the existing directory `dst`: directories, regular files
/// (content and permission bits) and symlinks, recursively; other file types are skipped.
/// Every entry made is owned by `owner` (uid, gid) when given. A missing `src` copies nothing.
///
/// # Errors
/// Reading `src` or writing `dst`.
pub fn seed(src: &Path, dst: &Path, owner: Option<(u32, u32)>) -> io::Result<()> {
    let entries = match std::fs::read_dir(src) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let from = entry.path();
        let to = dst.join(entry.file_name());
        let meta = std::fs::symlink_metadata(&from)?;
        let ft = meta.file_type();
        if ft.is_dir() {
            std::fs::create_dir(&to)?;
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(meta.mode() & 0o7777))?;
            seed(&from, &to, owner)?;
        } else if ft.is_file() {
            std::fs::copy(&from, &to)?;
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(meta.mode() & 0o777))?;
        } else if ft.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&from)?, &to)?;
        } else {
            continue;
        }
        if let Some((u, g)) = owner {
            std::os::unix::fs::lchown(&to, Some(u), Some(g))?;
        }
    }
    Ok(())
}

/// Give every entry below (and including) `path` that is owned by a uid of `from` to `owner`,
/// without following symlinks; the names in `skip` directly inside `path` are left alone.
/// Returns how many entries changed owner.
fn give(path: &Path, owner: (u32, u32), from: &From, skip: &[&str]) -> io::Result<u64> {
    let meta = std::fs::symlink_metadata(path)?;
    let mut n = 0;
    if from.has(meta.uid()) && meta.uid() != owner.0 {
        std::os::unix::fs::lchown(path, Some(owner.0), Some(owner.1))?;
        n += 1;
    }
    if meta.file_type().is_dir() {
        for entry in std::fs::read_dir(path)? {
            let entry = entry?;
            let name = entry.file_name();
            if skip.iter().any(|s| name == *s) {
                continue;
            }
            n += give(&entry.path(), owner, from, &[])?;
        }
    }
    Ok(n)
}

/// The owners [`prepare`] takes entries from: root, and the uids the tree was given to before
/// (`[first, end)` ranges), so that a changed `sandbox.uid` moves the tree along.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct From(Vec<(u32, u32)>);

impl From {
    /// Root, and the uids named by the mark `before` ([`OWNED_MARK`]'s content: `UID` or
    /// `per-smith FIRST`; anything else names none).
    pub fn mark(before: &str) -> From {
        let mut ranges = vec![(0, 1)];
        let t = before.trim();
        if let Some(first) = t
            .strip_prefix("per-smith ")
            .and_then(|f| f.parse::<u32>().ok())
        {
            ranges.push((first, first.saturating_add(super::user::PER_SMITH_RANGE)));
        } else if let Ok(uid) = t.parse::<u32>() {
            ranges.push((uid, uid.saturating_add(1)));
        }
        From(ranges)
    }

    fn has(&self, uid: u32) -> bool {
        self.0.iter().any(|&(a, b)| uid >= a && uid < b)
    }
}

/// What [`prepare`] did, for the daemon's log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Prepared {
    /// Smith dirs that got a `home/` (made before it existed).
    pub homes_added: u64,
    /// Empty `home/`s (never used) seeded from a `templates/home/` that has entries.
    pub homes_seeded: u64,
    /// Entries given from root to the agents' user(s).
    pub chowned: u64,
}

/// Is `path` a directory (not a symlink) with no entries?
fn is_empty_dir(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir())
        && std::fs::read_dir(path).is_ok_and(|mut d| d.next().is_none())
}

/// The areas of a smith dir only the smith itself (and the operator) may read (docs/SPEC.md §3):
/// with `sandbox.uid_per_smith` they are mode 0700 in the store, so another smith's uid could
/// not read them there even if it reached the store (defence in depth: through the mount the
/// rules alone decide).
pub const OWN_AREAS: [&str; 2] = ["private", HOME];

/// Mode 0700 on the [`OWN_AREAS`] of the smith dir `dir` that exist (not following symlinks).
///
/// # Errors
/// The first failing `chmod`.
pub fn close_own_areas(dir: &Path) -> io::Result<()> {
    for area in OWN_AREAS {
        let p = dir.join(area);
        if std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir()) {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700))?;
        }
    }
    Ok(())
}

/// At mount, before the filesystem scans the store at `root` (a path that reaches the store):
/// every smith dir (`smiths/smith-root` and, recursively, the valid names in `children/`) that
/// lacks `home/` gets one, seeded from `templates/home/`, and an empty `home/` (no run has used
/// it) is seeded too (notes XT5); with the sandbox on (`agents`) and
/// `rechown` (`Some`: the owners to take entries from), every entry of each smith dir owned by
/// one of them — but `conversations/`, the daemon's — becomes its smith's uid, and `results/`
/// the root smith's (docs/SPEC.md §12, "Ownership"); with `uid_per_smith` the
/// [`OWN_AREAS`] of every smith dir are made 0700 ([`close_own_areas`]).
///
/// # Errors
/// The first failing system call (the mount refuses: a tree half brought over is fixed by the
/// next mount, which does it again).
pub fn prepare(
    root: &Path,
    agents: Option<&AgentUser>,
    rechown: Option<&From>,
) -> io::Result<Prepared> {
    let mut done = Prepared::default();
    let templates = root.join(TEMPLATES_HOME);
    let smiths = root.join("smiths");
    let mut stack = vec![(smiths.join(crate::tree::model::ROOT_ID), FullId::root())];
    while let Some((dir, id)) = stack.pop() {
        if !std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
            continue;
        }
        let owner = match agents {
            Some(a) => Some(a.uid_of(&id).map_err(io::Error::other)?),
            None => None,
        };
        let home = dir.join(HOME);
        if std::fs::symlink_metadata(&home).is_err() {
            std::fs::create_dir(&home)?;
            std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755))?;
            if let Some((u, g)) = owner {
                std::os::unix::fs::lchown(&home, Some(u), Some(g))?;
            }
            seed(&templates, &home, owner)?;
            done.homes_added += 1;
        } else if is_empty_dir(&home) && !is_empty_dir(&templates) {
            // An empty home/ was never used (a CLI leaves its files there): seed it, so that what
            // the operator put in templates/home/ after `init` reaches the root smith too.
            seed(&templates, &home, owner)?;
            done.homes_seeded += 1;
        }
        if agents.is_some_and(|a| a.per_smith_range().is_some()) {
            close_own_areas(&dir)?;
        }
        if let (Some(o), Some(from)) = (owner, rechown) {
            done.chowned += give(&dir, o, from, &[DAEMON_OWNED, "children"])?;
            let children = dir.join("children");
            if std::fs::symlink_metadata(&children)
                .is_ok_and(|m| m.is_dir() && from.has(m.uid()) && m.uid() != o.0)
            {
                std::os::unix::fs::lchown(&children, Some(o.0), Some(o.1))?;
                done.chowned += 1;
            }
            if id.is_root() && std::fs::symlink_metadata(root.join("results")).is_ok() {
                done.chowned += give(&root.join("results"), o, from, &[])?;
            }
        }
        if let Ok(entries) = std::fs::read_dir(dir.join("children")) {
            for e in entries.flatten() {
                let name = e.file_name();
                if parse_child_name(&name).is_none() {
                    continue;
                }
                if let Some(child) = name.to_str().and_then(|n| id.child(n)) {
                    stack.push((e.path(), child));
                }
            }
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_copies_dirs_files_modes_and_symlinks() {
        let t = tempfile::tempdir().expect("tempdir");
        let src = t.path().join("src");
        std::fs::create_dir_all(src.join(".claude")).expect("mkdir");
        std::fs::write(src.join(".claude/settings.json"), "{}").expect("write");
        std::fs::set_permissions(
            src.join(".claude/settings.json"),
            std::fs::Permissions::from_mode(0o600),
        )
        .expect("chmod");
        std::os::unix::fs::symlink(".claude", src.join("link")).expect("symlink");
        let dst = t.path().join("dst");
        std::fs::create_dir(&dst).expect("mkdir");
        seed(&src, &dst, Some((4242, 4343))).expect("seed");
        let f = std::fs::metadata(dst.join(".claude/settings.json")).expect("stat");
        assert_eq!((f.mode() & 0o777, f.uid(), f.gid()), (0o600, 4242, 4343));
        assert_eq!(
            std::fs::read_link(dst.join("link")).expect("link").to_str(),
            Some(".claude")
        );
        // A missing seed is an empty home.
        seed(&t.path().join("none"), &dst, None).expect("none");
    }

    #[test]
    fn prepare_adds_homes_to_old_trees() {
        let t = tempfile::tempdir().expect("tempdir");
        let r = t.path();
        for d in [
            "smiths/smith-root/children/smith-001/children",
            "smiths/smith-root/children/stray",
            "templates/home/.config",
        ] {
            std::fs::create_dir_all(r.join(d)).expect("mkdir");
        }
        std::fs::write(r.join("templates/home/.config/x"), "seed").expect("write");
        let done = prepare(r, None, None).expect("prepare");
        assert_eq!(done.homes_added, 2);
        for d in ["smiths/smith-root", "smiths/smith-root/children/smith-001"] {
            assert_eq!(
                std::fs::read_to_string(r.join(d).join("home/.config/x")).expect("seeded"),
                "seed"
            );
        }
        assert!(!r.join("smiths/smith-root/children/stray/home").exists());
        let again = prepare(r, None, None).expect("again");
        assert_eq!((again.homes_added, again.homes_seeded), (0, 0));
        // an empty home/ (init's root, before the operator filled templates/home/) is seeded; a
        // used one is never touched
        let root_home = r.join("smiths/smith-root/home");
        std::fs::remove_dir_all(&root_home).expect("rm");
        std::fs::create_dir(&root_home).expect("mkdir");
        let child_home = r.join("smiths/smith-root/children/smith-001/home");
        std::fs::write(child_home.join(".config/x"), "used").expect("write");
        let done = prepare(r, None, None).expect("seed the empty home");
        assert_eq!((done.homes_added, done.homes_seeded), (0, 1));
        assert_eq!(
            std::fs::read_to_string(root_home.join(".config/x")).expect("seeded"),
            "seed"
        );
        assert_eq!(
            std::fs::read_to_string(child_home.join(".config/x")).expect("kept"),
            "used"
        );
    }
}
