//! setxattr, getxattr, listxattr, removexattr.

use std::ffi::OsStr;

use nix::errno::Errno;
use smithfs::fs::XattrReply;

use crate::world::*;

#[test]
fn xattrs_follow_read_and_write_rights() {
    let w = World::new();
    let private = w.node(&format!("{CHILD_DIR}/private"));
    w.write_file(&CHILD, private, "f", b"x").unwrap();
    let f = w.node(&format!("{CHILD_DIR}/private/f"));
    let name = OsStr::new("user.smithfs-test");
    w.fs.setxattr(&CHILD, f, name, b"v", 0).unwrap();
    match w.fs.getxattr(&CHILD, f, name, 16).unwrap() {
        XattrReply::Data(d) => assert_eq!(d, b"v"),
        XattrReply::Size(n) => panic!("size {n}"),
    }
    assert!(matches!(
        w.fs.getxattr(&CHILD, f, name, 0).unwrap(),
        XattrReply::Size(1)
    ));
    assert!(w.fs.listxattr(&CHILD, f, 0).is_ok());
    assert_eq!(errno(w.fs.setxattr(&ROOT, f, name, b"w", 0)), Errno::EACCES);
    assert_eq!(errno(w.fs.getxattr(&ROOT, f, name, 16)), Errno::EACCES);
    assert_eq!(errno(w.fs.removexattr(&ROOT, f, name)), Errno::EACCES);
    w.fs.removexattr(&CHILD, f, name).unwrap();
    // The control files carry none and take none.
    let ctl = w.node(".smithfs");
    assert_eq!(errno(w.fs.getxattr(&CHILD, ctl, name, 16)), Errno::ENODATA);
    assert_eq!(
        errno(w.fs.setxattr(&OPERATOR, ctl, name, b"v", 0)),
        Errno::EPERM
    );
    assert_eq!(errno(w.fs.removexattr(&OPERATOR, ctl, name)), Errno::EPERM);
}
