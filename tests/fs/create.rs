//! create, mkdir (the scaffold), mknod, symlink, link.

use std::ffi::OsStr;

use nix::errno::Errno;
use smithfs::trigger::Trigger;

use crate::world::*;

#[test]
fn mkdir_in_children_scaffolds_and_registers_a_smith() {
    let w = World::new();
    let created = w.take_triggers();
    assert!(
        created.contains(&Trigger::SmithCreated {
            smith: w.child,
            moved: false
        }),
        "{created:?}"
    );
    for area in [
        "inbox",
        "private",
        "outbox",
        "conversations",
        "children",
        "home",
        "smith.md",
    ] {
        assert!(w.store(&format!("{CHILD_DIR}/{area}")).exists(), "{area}");
    }
    // The child makes its own child; the operator may not skip a number; the parent of a
    // child is the only smith that may make one there.
    let children = w.node(&format!("{CHILD_DIR}/children"));
    assert_eq!(
        errno(w.fs.mkdir(&ROOT, children, OsStr::new("smith-001"), 0o755)),
        Errno::EACCES
    );
    w.fs.mkdir(&CHILD, children, OsStr::new("smith-001"), 0o755)
        .unwrap();
    assert!(w
        .fs
        .registry()
        .by_full_id("smith-root/smith-001/smith-001")
        .is_some());
    assert_eq!(
        errno(w.fs.mkdir(&CHILD, children, OsStr::new("smith-abc"), 0o755)),
        Errno::EINVAL
    );
    assert_eq!(
        errno(w.fs.mkdir(&CHILD, children, OsStr::new("smith-001"), 0o755)),
        Errno::EEXIST
    );
}

#[test]
fn creates_follow_the_create_right() {
    let w = World::new();
    let private = w.node(&format!("{CHILD_DIR}/private"));
    w.fs.mkdir(&CHILD, private, OsStr::new("notes"), 0o755)
        .unwrap();
    assert_eq!(
        errno(w.fs.mkdir(&ROOT, private, OsStr::new("spy"), 0o755)),
        Errno::EACCES
    );
    w.fs.symlink(&CHILD, private, OsStr::new("s"), OsStr::new("notes"))
        .unwrap();
    assert_eq!(
        errno(w.fs.symlink(&UNKNOWN, private, OsStr::new("u"), OsStr::new("x"))),
        Errno::EACCES
    );
    // A FIFO is an ordinary create; a device node is the operator's alone.
    w.fs.mknod(
        &CHILD,
        private,
        OsStr::new("fifo"),
        libc::S_IFIFO | 0o644,
        0,
    )
    .unwrap();
    assert_eq!(
        errno(w.fs.mknod(&CHILD, private, OsStr::new("dev"), libc::S_IFCHR | 0o644, 0)),
        Errno::EPERM
    );
    assert!(w.why(&CHILD).contains("device"), "{}", w.why(&CHILD));
}

#[test]
fn reserved_names_are_refused_and_explained() {
    let w = World::new();
    assert_eq!(
        errno(w.fs.mkdir(&OPERATOR, NodeId::ROOT, OsStr::new(".smithfs-state"), 0o755)),
        Errno::EPERM
    );
    let ctl = w.node(".smithfs");
    assert_eq!(
        errno(w.fs.mkdir(&OPERATOR, ctl, OsStr::new("x"), 0o755)),
        Errno::EPERM
    );
    assert!(
        w.why(&OPERATOR).contains("control directory"),
        "{}",
        w.why(&OPERATOR)
    );
}

#[test]
fn link_stays_in_one_zone() {
    let w = World::new();
    let private = w.node(&format!("{CHILD_DIR}/private"));
    let outbox = w.node(&format!("{CHILD_DIR}/outbox"));
    w.write_file(&CHILD, private, "a", b"a").unwrap();
    let a = w.node(&format!("{CHILD_DIR}/private/a"));
    w.fs.link(&CHILD, a, private, OsStr::new("b")).unwrap();
    assert_eq!(
        errno(w.fs.link(&CHILD, a, outbox, OsStr::new("a"))),
        Errno::EXDEV
    );
}
