//! lookup, getattr, setattr, readlink, forget.

use std::ffi::OsStr;

use nix::errno::Errno;
use smithfs::fs::SetAttr;

use crate::world::*;

#[test]
fn the_state_dir_is_never_shown_and_the_control_dir_always_is() {
    let w = World::new();
    assert_eq!(
        errno(w.fs.lookup(NodeId::ROOT, OsStr::new(".smithfs-state"))),
        Errno::ENOENT
    );
    let ctl = w.node(".smithfs");
    for name in ["whoami", "why", "status.json", "events.jsonl", "ctl"] {
        assert!(w.fs.lookup(ctl, OsStr::new(name)).is_ok(), "{name}");
    }
    assert_eq!(errno(w.fs.lookup(ctl, OsStr::new("nope"))), Errno::ENOENT);
}

#[test]
fn getattr_shows_node_ids_and_forget_keeps_the_root() {
    let w = World::new();
    let inbox = w.node(&format!("{CHILD_DIR}/inbox"));
    let attr = w.fs.getattr(inbox, None).unwrap();
    assert_eq!(attr.node(), inbox);
    assert_eq!(attr.0.st_mode & libc::S_IFMT, libc::S_IFDIR);
    assert_eq!(
        w.fs.getattr(NodeId::ROOT, None).unwrap().node(),
        NodeId::ROOT
    );
    w.fs.forget(inbox, 1);
}

#[test]
fn setattr_follows_the_write_right() {
    let w = World::new();
    let inbox = w.node(&format!("{CHILD_DIR}/inbox"));
    w.write_file(&ROOT, inbox, "task-001.md", b"do it\n")
        .unwrap();
    let task = w.node(&format!("{CHILD_DIR}/inbox/task-001.md"));
    let chmod = SetAttr {
        mode: Some(0o600),
        ..SetAttr::default()
    };
    // The owner reads its inbox but may not change it (docs/SPEC.md §3); the parent may.
    assert_eq!(errno(w.fs.setattr(&CHILD, task, &chmod)), Errno::EACCES);
    assert!(w.why(&CHILD).contains("inbox"), "{}", w.why(&CHILD));
    let attr = w.fs.setattr(&ROOT, task, &chmod).unwrap();
    assert_eq!(attr.0.st_mode & 0o777, 0o600);
    let truncate = SetAttr {
        size: Some(0),
        ..SetAttr::default()
    };
    assert_eq!(
        errno(w.fs.setattr(&UNKNOWN, task, &truncate)),
        Errno::EACCES
    );
    // The control files have fixed attributes.
    let ctl = w.node(".smithfs");
    assert_eq!(errno(w.fs.setattr(&OPERATOR, ctl, &chmod)), Errno::EPERM);
}

#[test]
fn readlink_needs_the_read_right() {
    let w = World::new();
    let private = w.node(&format!("{CHILD_DIR}/private"));
    w.fs.symlink(&CHILD, private, OsStr::new("l"), OsStr::new("target"))
        .unwrap();
    let l = w.node(&format!("{CHILD_DIR}/private/l"));
    assert_eq!(w.fs.readlink(&CHILD, l).unwrap(), b"target");
    assert_eq!(errno(w.fs.readlink(&ROOT, l)), Errno::EACCES);
}
