//! open, create, read, write, release (completion), fsync, fallocate, lseek, copy_file_range.

use std::ffi::OsStr;

use nix::errno::Errno;
use smithfs::trigger::Trigger;

use crate::world::*;

#[test]
fn a_task_completed_in_an_inbox_and_a_result_in_an_outbox_trigger() {
    let w = World::new();
    w.take_triggers();
    let inbox = w.node(&format!("{CHILD_DIR}/inbox"));
    w.write_file(&ROOT, inbox, "task-001.md", b"count\n")
        .unwrap();
    let outbox = w.node(&format!("{CHILD_DIR}/outbox"));
    w.write_file(&CHILD, outbox, "result.md", b"42\n").unwrap();
    w.write_file(&CHILD, outbox, "notes.md", b"not a result\n")
        .unwrap();
    assert_eq!(
        w.take_triggers(),
        [
            Trigger::TaskAssigned {
                smith: w.child,
                file: "task-001.md".into()
            },
            Trigger::ResultPublished { smith: w.child },
        ]
    );
}

#[test]
fn open_is_judged_by_the_opener_and_handles_keep_their_access() {
    let w = World::new();
    let private = w.node(&format!("{CHILD_DIR}/private"));
    w.write_file(&CHILD, private, "f", b"hello").unwrap();
    let f = w.node(&format!("{CHILD_DIR}/private/f"));
    assert_eq!(errno(w.fs.open(&ROOT, f, libc::O_RDONLY)), Errno::EACCES);
    assert_eq!(errno(w.fs.open(&UNKNOWN, f, libc::O_RDONLY)), Errno::EACCES);
    let (fh, _) = w.fs.open(&CHILD, f, libc::O_RDONLY).unwrap();
    assert_eq!(w.fs.read(f, fh, 0, 16).unwrap(), b"hello");
    assert_eq!(w.fs.lseek(f, fh, 0, libc::SEEK_END).unwrap(), 5);
    // A read-only handle does not write, whoever asks.
    assert_eq!(
        errno(w.fs.write(&CHILD, f, fh, 0, b"x", false)),
        Errno::EBADF
    );
    assert_eq!(errno(w.fs.fallocate(fh, 0, 10, 0)), Errno::EBADF);
    w.fs.release(f, fh).unwrap();
    let (fh, _) = w.fs.open(&CHILD, f, libc::O_RDWR).unwrap();
    assert_eq!(w.fs.write(&CHILD, f, fh, 5, b" world", false).unwrap(), 6);
    w.fs.fsync(f, fh, false).unwrap();
    w.fs.flush(f, fh).unwrap();
    w.fs.release(f, fh).unwrap();
    assert_eq!(
        std::fs::read(w.store(&format!("{CHILD_DIR}/private/f"))).unwrap(),
        b"hello world"
    );
    // The inbox is the parent's to write: the owner may only read it.
    let inbox = w.node(&format!("{CHILD_DIR}/inbox"));
    assert_eq!(
        errno(w.fs.create(
            &CHILD,
            inbox,
            OsStr::new("task-002.md"),
            0o644,
            libc::O_WRONLY
        )),
        Errno::EACCES
    );
}
