//! unlink and rmdir.

use std::ffi::OsStr;

use nix::errno::Errno;
use smithfs::trigger::Trigger;

use crate::world::*;

#[test]
fn unlink_follows_the_delete_right() {
    let w = World::new();
    let outbox = w.node(&format!("{CHILD_DIR}/outbox"));
    w.write_file(&CHILD, outbox, "draft.md", b"x").unwrap();
    w.node(&format!("{CHILD_DIR}/outbox/draft.md"));
    assert_eq!(
        errno(w.fs.remove(&ROOT, outbox, OsStr::new("draft.md"), false)),
        Errno::EACCES
    );
    w.fs.remove(&CHILD, outbox, OsStr::new("draft.md"), false)
        .unwrap();
    assert!(!w.store(&format!("{CHILD_DIR}/outbox/draft.md")).exists());
}

#[test]
fn structure_is_smithfs_s_and_idle_smith_dirs_go_with_the_operator() {
    let w = World::new();
    let smith = w.node(CHILD_DIR);
    w.node(&format!("{CHILD_DIR}/inbox"));
    // An area directory is structure: no smith removes it; the operator may while nothing
    // runs in the subtree, so that `rm -rf` works bottom-up (P10).
    assert_eq!(
        errno(w.fs.remove(&CHILD, smith, OsStr::new("inbox"), true)),
        Errno::EPERM
    );
    assert_eq!(
        errno(w.fs.remove(&ROOT, smith, OsStr::new("inbox"), true)),
        Errno::EPERM
    );
    w.fs.remove(&OPERATOR, smith, OsStr::new("inbox"), true)
        .unwrap();
    // The state dir does not exist in the mount's view.
    assert_eq!(
        errno(w.fs.remove(&OPERATOR, NodeId::ROOT, OsStr::new(".smithfs-state"), true)),
        Errno::ENOENT
    );
    w.take_triggers();
    // The operator removes an idle smith dir (emptied first, like rm -rf): it is unregistered.
    for e in std::fs::read_dir(w.store(CHILD_DIR)).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            std::fs::remove_dir_all(p).unwrap();
        } else {
            std::fs::remove_file(p).unwrap();
        }
    }
    let children = w.node("smiths/smith-root/children");
    w.fs.remove(&OPERATOR, children, OsStr::new("smith-001"), true)
        .unwrap();
    assert!(w.fs.registry().by_full_id("smith-root/smith-001").is_none());
    assert!(w
        .take_triggers()
        .contains(&Trigger::SmithRemoved { smith: w.child }));
}
