//! Hard links and the access check (docs/PROTOCOL-NOTES.md, C14 and C24), on a `SmithFs`
//! over a temp dir without a kernel: this test plays the kernel (lookups, forgets, opens) so
//! that the daemon's knowledge of names is exactly what each case says.
//!
//! The tree: the root smith (the parent) and its child `smith-001` (the owner of the files).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use nix::errno::Errno;
use smithfs::fs::{backing, Caller, FsError, FsOptions, Identities, NodeId, SmithFs};
use smithfs::identity::Identity;
use smithfs::tree::model::{FullId, SmithIdx};

const SMITHFS: &str = env!("CARGO_BIN_EXE_smithfs");
const OPERATOR: Caller = Caller {
    pid: 1,
    uid: 0,
    gid: 0,
    as_smith: None,
};
const PARENT: Caller = Caller {
    pid: 2,
    uid: 0,
    gid: 0,
    as_smith: None,
};
const CHILD: Caller = Caller {
    pid: 3,
    uid: 0,
    gid: 0,
    as_smith: None,
};

/// Pid → identity, set by the test (every other pid is the operator).
#[derive(Default)]
struct Ids(Mutex<HashMap<u32, Identity>>);

impl Identities for Ids {
    fn resolve(&self, pid: u32) -> Identity {
        self.0
            .lock()
            .unwrap()
            .get(&pid)
            .copied()
            .unwrap_or(Identity::Operator)
    }
    fn bind(&self, _pid: u32, _smith: SmithIdx) -> Result<(), smithfs::fs::BindError> {
        Err(smithfs::fs::BindError {
            errno: Errno::ENOSYS,
            reason: "test identities bind nothing".into(),
        })
    }
    fn register_smith(&self, _smith: SmithIdx, _full_id: &FullId) {}
    fn mode_name(&self) -> &'static str {
        "test"
    }
}

struct Fixture {
    dir: tempfile::TempDir,
    fs: SmithFs,
    /// Node ids of the child's private/, outbox/ and outbox/sub/.
    private: NodeId,
    outbox: NodeId,
    sub: NodeId,
}

impl Fixture {
    /// A store made by `smithfs init`, the child scaffolded by the operator, files written by
    /// `setup` in the store (behind the daemon's back) before the child's areas are looked up.
    fn new(setup: impl FnOnce(&Path)) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new(SMITHFS)
            .arg("init")
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "init: {out:?}");
        let ids = Arc::new(Ids::default());
        let root = backing::open_store_root(dir.path()).unwrap();
        let fs = SmithFs::new(root, FsOptions::default(), ids.clone()).unwrap();
        let children = walk(&fs, NodeId::ROOT, "smiths/smith-root/children");
        fs.mkdir(&OPERATOR, children, OsStr::new("smith-001"), 0o755)
            .unwrap();
        let reg = fs.registry();
        let parent = reg.by_full_id("smith-root").unwrap();
        let child = reg.by_full_id("smith-root/smith-001").unwrap();
        ids.0
            .lock()
            .unwrap()
            .extend([(2, Identity::Smith(parent)), (3, Identity::Smith(child))]);
        let c = dir.path().join("smiths/smith-root/children/smith-001");
        std::fs::create_dir(c.join("outbox/sub")).unwrap();
        setup(&c);
        let base = "smiths/smith-root/children/smith-001";
        let private = walk(&fs, NodeId::ROOT, &format!("{base}/private"));
        let outbox = walk(&fs, NodeId::ROOT, &format!("{base}/outbox"));
        let sub = walk(&fs, outbox, "sub");
        Fixture {
            dir,
            fs,
            private,
            outbox,
            sub,
        }
    }

    /// The child's smith dir in the store.
    fn store(&self) -> std::path::PathBuf {
        self.dir.path().join("smiths/smith-root/children/smith-001")
    }

    /// Open `name` in `dir` for reading as `who` (a lookup first, as the kernel does); the
    /// lookup is forgotten again afterwards.
    fn read(&self, who: &Caller, dir: NodeId, name: &str) -> Result<(), Errno> {
        let ino = lookup(&self.fs, dir, name);
        let r = self.fs.open(who, ino, libc::O_RDONLY).map(|(fh, _)| {
            self.fs.release(ino, fh).unwrap();
        });
        self.fs.forget(ino, 1);
        r.map_err(|e| e.errno())
    }

    fn rename(&self, who: &Caller, from: (NodeId, &str), to: (NodeId, &str)) -> Result<(), Errno> {
        self.fs
            .rename(who, from.0, OsStr::new(from.1), to.0, OsStr::new(to.1), 0)
            .map_err(|e| e.errno())
    }
}

fn lookup(fs: &SmithFs, dir: NodeId, name: &str) -> NodeId {
    let (attr, _) = fs
        .lookup(dir, OsStr::new(name))
        .unwrap_or_else(|e| panic!("lookup {name}: {e}"));
    attr.node()
}

fn walk(fs: &SmithFs, mut dir: NodeId, path: &str) -> NodeId {
    for part in path.split('/') {
        dir = lookup(fs, dir, part);
    }
    dir
}

/// A file hard-linked outside the mount into outbox/ and private/: while its private name is
/// unseen it fails closed for the parent (the owner and the operator keep their rights); once
/// seen, the intersection of outbox/ and private/ still refuses the parent.
#[test]
fn unseen_private_name_fails_closed_then_intersects() {
    let f = Fixture::new(|c| {
        std::fs::write(c.join("outbox/both"), "two names\n").unwrap();
        std::fs::hard_link(c.join("outbox/both"), c.join("private/both")).unwrap();
    });
    assert_eq!(f.read(&PARENT, f.outbox, "both"), Err(Errno::EACCES));
    assert_eq!(f.read(&CHILD, f.outbox, "both"), Ok(()));
    assert_eq!(f.read(&OPERATOR, f.outbox, "both"), Ok(()));
    // The kernel holds the outbox name while the private one is looked up.
    let held = lookup(&f.fs, f.outbox, "both");
    let private = lookup(&f.fs, f.private, "both");
    assert_eq!(held, private);
    assert_eq!(
        f.fs.open(&PARENT, held, libc::O_RDONLY)
            .unwrap_err()
            .errno(),
        Errno::EACCES
    );
    f.fs.forget(held, 2);
    // Removed through the mount, the private name no longer restricts the file.
    f.fs.remove(&CHILD, f.private, OsStr::new("both"), false)
        .unwrap();
    assert_eq!(f.read(&PARENT, f.outbox, "both"), Ok(()));
}

/// Two names in one directory are found by looking there; two in different directories of one
/// zone are not until the other is looked up. Forgetting the inode loses nothing that matters.
#[test]
fn same_zone_names_are_found_or_looked_up() {
    let f = Fixture::new(|c| {
        std::fs::write(c.join("outbox/pair"), "twice\n").unwrap();
        std::fs::hard_link(c.join("outbox/pair"), c.join("outbox/pair2")).unwrap();
        std::fs::write(c.join("outbox/deep"), "deeper\n").unwrap();
        std::fs::hard_link(c.join("outbox/deep"), c.join("outbox/sub/deep")).unwrap();
    });
    for _ in 0..2 {
        // Each read looks the name up afresh and forgets it: the daemon relearns every time.
        assert_eq!(f.read(&PARENT, f.outbox, "pair"), Ok(()));
        assert_eq!(f.read(&PARENT, f.outbox, "pair2"), Ok(()));
        assert_eq!(f.read(&PARENT, f.outbox, "deep"), Err(Errno::EACCES));
        assert_eq!(f.read(&PARENT, f.sub, "deep"), Err(Errno::EACCES));
    }
    let held = lookup(&f.fs, f.sub, "deep");
    assert_eq!(f.read(&PARENT, f.outbox, "deep"), Ok(()));
    f.fs.forget(held, 1);
    // A link made outside the mount while the daemon holds the file is seen at the next lookup.
    let held = lookup(&f.fs, f.outbox, "pair");
    std::fs::hard_link(
        f.store().join("outbox/pair"),
        f.store().join("private/pair3"),
    )
    .unwrap();
    assert_eq!(f.read(&PARENT, f.outbox, "pair"), Err(Errno::EACCES));
    f.fs.forget(held, 1);
}

/// A file with other names renames within its zone only; with one name left it moves freely.
#[test]
fn linked_file_renames_within_its_zone() {
    let f = Fixture::new(|c| {
        std::fs::write(c.join("private/a"), "draft\n").unwrap();
        std::fs::hard_link(c.join("private/a"), c.join("private/b")).unwrap();
    });
    assert_eq!(
        f.rename(&CHILD, (f.private, "b"), (f.outbox, "b")),
        Err(Errno::EXDEV)
    );
    assert_eq!(
        f.rename(&OPERATOR, (f.private, "b"), (f.outbox, "b")),
        Err(Errno::EXDEV)
    );
    assert_eq!(f.rename(&CHILD, (f.private, "b"), (f.private, "c")), Ok(()));
    f.fs.remove(&CHILD, f.private, OsStr::new("a"), false)
        .unwrap();
    assert_eq!(f.rename(&CHILD, (f.private, "c"), (f.outbox, "c")), Ok(()));
    assert_eq!(f.read(&PARENT, f.outbox, "c"), Ok(()));
    // Policy refusals come first: the parent may not take a name out of private/ at all.
    std::fs::hard_link(f.store().join("outbox/c"), f.store().join("outbox/d")).unwrap();
    assert_eq!(
        f.rename(&PARENT, (f.outbox, "c"), (f.private, "c")),
        Err(Errno::EACCES)
    );
    assert!(matches!(
        f.fs.rename(
            &CHILD,
            f.outbox,
            OsStr::new("c"),
            f.private,
            OsStr::new("c"),
            0
        ),
        Err(FsError::Denied(Errno::EXDEV))
    ));
}
