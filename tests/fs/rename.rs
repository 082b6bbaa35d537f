//! rename (and its whiteout and exchange flags).

use std::ffi::OsStr;

use nix::errno::Errno;

use crate::world::*;

#[test]
fn rename_is_delete_at_the_source_and_create_at_the_destination() {
    let w = World::new();
    let private = w.node(&format!("{CHILD_DIR}/private"));
    let outbox = w.node(&format!("{CHILD_DIR}/outbox"));
    w.write_file(&CHILD, private, "a", b"a").unwrap();
    w.node(&format!("{CHILD_DIR}/private/a"));
    w.fs.rename(
        &CHILD,
        private,
        OsStr::new("a"),
        private,
        OsStr::new("b"),
        0,
    )
    .unwrap();
    w.node(&format!("{CHILD_DIR}/private/b"));
    assert_eq!(
        errno(w.fs.rename(&ROOT, private, OsStr::new("b"), private, OsStr::new("c"), 0)),
        Errno::EACCES
    );
    w.fs.rename(&CHILD, private, OsStr::new("b"), outbox, OsStr::new("b"), 0)
        .unwrap();
    assert!(w.store(&format!("{CHILD_DIR}/outbox/b")).exists());
}

#[test]
fn a_whiteout_is_a_device_node_and_the_operator_s_alone() {
    let w = World::new();
    let private = w.node(&format!("{CHILD_DIR}/private"));
    w.write_file(&CHILD, private, "a", b"a").unwrap();
    w.node(&format!("{CHILD_DIR}/private/a"));
    let flags = libc::RENAME_WHITEOUT;
    assert_eq!(
        errno(w.fs.rename(
            &CHILD,
            private,
            OsStr::new("a"),
            private,
            OsStr::new("b"),
            flags
        )),
        Errno::EPERM
    );
    assert!(
        w.why(&CHILD).contains("RENAME_WHITEOUT"),
        "{}",
        w.why(&CHILD)
    );
    assert!(w.store(&format!("{CHILD_DIR}/private/a")).exists());
}

#[test]
fn the_root_smith_dir_never_moves() {
    let w = World::new();
    let smiths = w.node("smiths");
    w.node("smiths/smith-root");
    assert_eq!(
        errno(w.fs.rename(
            &OPERATOR,
            smiths,
            OsStr::new("smith-root"),
            smiths,
            OsStr::new("elsewhere"),
            0
        )),
        Errno::EPERM
    );
}
