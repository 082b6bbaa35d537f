//! Storage quotas (docs/SPEC.md §8): the books kept exact across writes, fallocate (incl.
//! punching holes), truncation, sparse files, hard links, renames between a smith's own areas
//! and unlinks of open files — checked against a fresh scan of the store — and EDQUOT with a
//! `why` beyond the limits.

use std::ffi::OsStr;

use nix::errno::Errno;
use smithfs::fs::{Fh, FsOptions, SetAttr};
use smithfs::limits::storage::Usage;
use smithfs::limits::Size;

use crate::world::*;

fn limited(bytes: u64, inodes: u64) -> World {
    let limits = smithfs::config::Limits {
        max_bytes_per_smith: Some(Size(bytes)),
        max_inodes_per_smith: Some(inodes),
        ..Default::default()
    };
    let live = smithfs::limits::live::LiveLimits::new(smithfs::limits::live::Snapshot::new(
        limits,
        1 << 20,
    ));
    World::with_options(FsOptions {
        limits: std::sync::Arc::new(live),
        ..FsOptions::default()
    })
}

/// The books (without orphans) equal a fresh scan of the store.
fn assert_exact(w: &World) {
    let books = w.fs.storage_books().expect("books are kept").visible();
    let scan = w.fs.storage_scan().expect("scan");
    assert_eq!(books.totals(), scan.totals(), "books vs scan");
}

fn usage(w: &World) -> Usage {
    w.fs.storage_usage(w.child).expect("books are kept")
}

/// Create `name` in `dir` as the child and keep it open for writing: (node, handle).
fn create(w: &World, dir: NodeId, name: &str) -> (NodeId, Fh) {
    let (attr, fh) =
        w.fs.create(&CHILD, dir, OsStr::new(name), 0o644, libc::O_RDWR)
            .unwrap();
    (attr.node(), fh)
}

#[test]
fn the_books_stay_exact_through_a_storm_of_operations() {
    let w = limited(64 << 20, 1000);
    assert_exact(&w);
    let private = w.node(&format!("{CHILD_DIR}/private"));
    let outbox = w.node(&format!("{CHILD_DIR}/outbox"));
    let before = usage(&w);
    // Writes.
    let (a, fh) = create(&w, private, "a");
    let chunk = vec![7u8; 64 << 10];
    for i in 0..4u64 {
        w.fs.write(&CHILD, a, fh, i * chunk.len() as u64, &chunk, false)
            .unwrap();
    }
    assert_exact(&w);
    assert!(
        usage(&w).bytes >= before.bytes + (256 << 10),
        "{:?}",
        usage(&w)
    );
    // fallocate, punch a hole, keep-size preallocation.
    w.fs.fallocate(fh, 256 << 10, 512 << 10, 0).unwrap();
    assert_exact(&w);
    let full = usage(&w).bytes;
    w.fs.fallocate(
        fh,
        64 << 10,
        128 << 10,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
    )
    .unwrap();
    assert_exact(&w);
    assert!(
        usage(&w).bytes <= full - (128 << 10),
        "a punched hole gives space back"
    );
    w.fs.fallocate(fh, 2 << 20, 64 << 10, libc::FALLOC_FL_KEEP_SIZE)
        .unwrap();
    assert_exact(&w);
    // Truncate up (a hole costs nothing), a sparse write far out, truncate down.
    let grown = usage(&w).bytes;
    let up = SetAttr {
        size: Some(100 << 20),
        fh: Some(fh),
        ..SetAttr::default()
    };
    w.fs.setattr(&CHILD, a, &up).unwrap();
    assert_eq!(usage(&w).bytes, grown, "truncating up allocates nothing");
    w.fs.write(&CHILD, a, fh, 50 << 20, b"far out", false)
        .unwrap();
    assert_exact(&w);
    let down = SetAttr {
        size: Some(4096),
        fh: Some(fh),
        ..SetAttr::default()
    };
    w.fs.setattr(&CHILD, a, &down).unwrap();
    assert_exact(&w);
    w.fs.release(a, fh).unwrap();
    // Hard links, directories, symlinks, renames between the child's own areas.
    let linked = w.fs.link(&CHILD, a, private, OsStr::new("a2")).unwrap();
    assert_eq!(linked.0.st_nlink, 2);
    let d =
        w.fs.mkdir(&CHILD, private, OsStr::new("d"), 0o755)
            .unwrap()
            .node();
    w.write_file(&CHILD, d, "inner", &vec![1u8; 20_000])
        .unwrap();
    w.fs.symlink(&CHILD, private, OsStr::new("s"), OsStr::new("a"))
        .unwrap();
    assert_exact(&w);
    // (A name of a multiply-linked file moves within its zone only.)
    w.fs.rename(
        &CHILD,
        private,
        OsStr::new("a2"),
        private,
        OsStr::new("a3"),
        0,
    )
    .unwrap();
    w.write_file(&CHILD, private, "c", &vec![4u8; 30_000])
        .unwrap();
    let mid = usage(&w);
    w.fs.rename(&CHILD, private, OsStr::new("c"), outbox, OsStr::new("c"), 0)
        .unwrap();
    w.fs.rename(&CHILD, private, OsStr::new("d"), outbox, OsStr::new("d"), 0)
        .unwrap();
    assert_exact(&w);
    assert_eq!(
        usage(&w).inodes,
        mid.inodes,
        "a rename between own areas moves nothing"
    );
    // A task the parent writes into the child's inbox counts for the parent.
    let inbox = w.node(&format!("{CHILD_DIR}/inbox"));
    let root = w.fs.registry().root().unwrap();
    let parent_before = w.fs.storage_usage(root).unwrap();
    w.write_file(&ROOT, inbox, "task-1.md", &vec![b'x'; 10_000])
        .unwrap();
    assert_eq!(usage(&w).inodes, mid.inodes);
    assert_eq!(
        w.fs.storage_usage(root).unwrap().inodes,
        parent_before.inodes + 1
    );
    assert_exact(&w);
    // An unlinked open file keeps its space until the kernel lets go of it.
    let (b, fh) = create(&w, private, "b");
    w.fs.write(&CHILD, b, fh, 0, &vec![2u8; 128 << 10], false)
        .unwrap();
    let with_b = usage(&w);
    w.fs.remove(&CHILD, private, OsStr::new("b"), false)
        .unwrap();
    assert_eq!(usage(&w), with_b, "still open: still charged");
    w.fs.write(&CHILD, b, fh, 128 << 10, &vec![3u8; 64 << 10], false)
        .unwrap();
    assert!(
        usage(&w).bytes > with_b.bytes,
        "writes to an unlinked open file count"
    );
    assert_exact(&w);
    w.fs.release(b, fh).unwrap();
    w.fs.forget(b, u64::MAX);
    assert_eq!(
        usage(&w).inodes,
        with_b.inodes - 1,
        "the forget gives it back"
    );
    assert_exact(&w);
    // Unlinking one of two names changes nothing; the last one frees the file.
    w.fs.remove(&CHILD, private, OsStr::new("a"), false)
        .unwrap();
    assert_exact(&w);
    w.fs.remove(&CHILD, private, OsStr::new("a3"), false)
        .unwrap();
    w.fs.forget(a, u64::MAX);
    assert_exact(&w);
}

#[test]
fn beyond_the_byte_limit_writes_fail_with_edquot_and_a_why() {
    let w = limited(1 << 20, 1000);
    let private = w.node(&format!("{CHILD_DIR}/private"));
    let (f, fh) = create(&w, private, "big");
    let chunk = vec![9u8; 64 << 10];
    let mut written = 0u64;
    let err = loop {
        match w.fs.write(&CHILD, f, fh, written, &chunk, false) {
            Ok(n) => written += u64::from(n),
            Err(e) => break e.errno(),
        }
        assert!(written <= 2 << 20, "never refused");
    };
    assert_eq!(err, Errno::EDQUOT);
    assert!(usage(&w).bytes <= 1 << 20, "{:?}", usage(&w));
    assert!(
        written >= (1 << 20) - (128 << 10),
        "refused early: {written}"
    );
    let why = w.why(&CHILD);
    assert!(why.contains("storage-bytes-per-smith"), "{why}");
    assert!(why.contains("max_bytes_per_smith"), "{why}");
    // fallocate beyond the limit too; overwriting in place and shrinking still work.
    assert_eq!(
        errno(w.fs.fallocate(fh, written, 1 << 20, 0)),
        Errno::EDQUOT
    );
    w.fs.write(&CHILD, f, fh, 0, &chunk, false).unwrap();
    let half = SetAttr {
        size: Some(written / 2),
        fh: Some(fh),
        ..SetAttr::default()
    };
    w.fs.setattr(&CHILD, f, &half).unwrap();
    w.fs.write(&CHILD, f, fh, written / 2, &chunk, false)
        .unwrap();
    w.fs.release(f, fh).unwrap();
    // The parent and the operator are not held back by the child's quota.
    let ppriv = w.node("smiths/smith-root/private");
    w.write_file(&ROOT, ppriv, "p", &vec![1u8; 512 << 10])
        .unwrap();
    w.write_file(&OPERATOR, private, "op", &vec![1u8; 512 << 10])
        .unwrap();
    assert_exact(&w);
}

#[test]
fn beyond_the_inode_limit_creates_fail_with_edquot() {
    let w = limited(1 << 30, 20);
    let private = w.node(&format!("{CHILD_DIR}/private"));
    let mut made = 0;
    let err = loop {
        let name = format!("f{made}");
        match w
            .fs
            .mknod(&CHILD, private, OsStr::new(&name), libc::S_IFREG | 0o644, 0)
        {
            Ok(_) => made += 1,
            Err(e) => break e.errno(),
        }
        assert!(made <= 20, "never refused");
    };
    assert_eq!(err, Errno::EDQUOT);
    assert_eq!(usage(&w).inodes, 20);
    for op in [
        w.fs.mkdir(&CHILD, private, OsStr::new("d"), 0o755)
            .map(drop),
        w.fs.symlink(&CHILD, private, OsStr::new("s"), OsStr::new("x"))
            .map(drop),
    ] {
        assert_eq!(errno(op), Errno::EDQUOT);
    }
    assert!(w.why(&CHILD).contains("storage-inodes-per-smith"));
    // A hard link is no new inode; a removal makes room.
    let f0 = w.node(&format!("{CHILD_DIR}/private/f0"));
    w.fs.link(&CHILD, f0, private, OsStr::new("f0-again"))
        .unwrap();
    let f1 = w.node(&format!("{CHILD_DIR}/private/f1"));
    w.fs.remove(&CHILD, private, OsStr::new("f1"), false)
        .unwrap();
    // (The kernel forgets an unlinked inode once it has no use for it.)
    w.fs.forget(f1, u64::MAX);
    w.fs.mkdir(&CHILD, private, OsStr::new("d"), 0o755).unwrap();
    assert_exact(&w);
}

#[test]
fn without_a_quota_nothing_is_counted() {
    let w = World::new();
    assert!(w.fs.storage_usage(w.child).is_none());
    let private = w.node(&format!("{CHILD_DIR}/private"));
    w.write_file(&CHILD, private, "f", &vec![1u8; 1 << 20])
        .unwrap();
}

/// Extended attributes are charged (docs/PROTOCOL-NOTES.md L18): a large value's block shows in
/// the books as in a scan, its removal gives it back, and at the quota a `setxattr` is refused.
#[test]
fn extended_attributes_are_charged() {
    let w = limited(1 << 20, 1000);
    let private = w.node(&format!("{CHILD_DIR}/private"));
    w.write_file(&CHILD, private, "x", b"x").unwrap();
    let f = w.node(&format!("{CHILD_DIR}/private/x"));
    let name = OsStr::new("user.smithfs-big");
    let before = usage(&w);
    // Filesystems without user xattrs (tmpfs without them) cannot tell anything here.
    if w.fs.setxattr(&CHILD, f, name, &[5u8; 3000], 0).is_err() {
        eprintln!("skipped: no user xattrs on this store");
        return;
    }
    assert_exact(&w);
    let with = usage(&w);
    eprintln!("xattr of 3000 B: {before:?} -> {with:?}");
    w.fs.removexattr(&CHILD, f, name).unwrap();
    assert_exact(&w);
    // Fill the quota, then a value that needs a block is refused.
    let (g, fh) = create(&w, private, "fill");
    let mut off = 0u64;
    for size in [64 << 10, 4 << 10] {
        let chunk = vec![1u8; size];
        while let Ok(n) = w.fs.write(&CHILD, g, fh, off, &chunk, false) {
            off += u64::from(n);
        }
    }
    w.fs.release(g, fh).unwrap();
    assert_eq!(
        errno(w.fs.setxattr(&CHILD, f, name, &[5u8; 3000], 0)),
        Errno::EDQUOT
    );
    assert_exact(&w);
}
