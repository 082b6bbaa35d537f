//! The fixture: a store with the root smith and its child `smith-001`, four callers (the
//! operator, the root smith, the child, an unknown process) and the triggers the filesystem sent.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::sync::{Arc, Mutex};

use nix::errno::Errno;
pub use smithfs::fs::NodeId;
use smithfs::fs::{
    backing, AttrCache, BindError, Caller, FsOptions, Identities, Ports, Scheduling, SmithFs,
};
use smithfs::identity::Identity;
use smithfs::tree::model::{FullId, SmithIdx};
use smithfs::trigger::Trigger;

const SMITHFS: &str = env!("CARGO_BIN_EXE_smithfs");

/// The operator (pid 1).
pub const OPERATOR: Caller = Caller {
    pid: 1,
    uid: 0,
    gid: 0,
    as_smith: None,
};
/// The root smith (pid 2).
pub const ROOT: Caller = Caller {
    pid: 2,
    uid: 0,
    gid: 0,
    as_smith: None,
};
/// The root smith's child `smith-root/smith-001` (pid 3).
pub const CHILD: Caller = Caller {
    pid: 3,
    uid: 0,
    gid: 0,
    as_smith: None,
};
/// A process of unknown identity (pid 4).
pub const UNKNOWN: Caller = Caller {
    pid: 4,
    uid: 0,
    gid: 0,
    as_smith: None,
};

/// The child's smith dir, relative to the mount root.
pub const CHILD_DIR: &str = "smiths/smith-root/children/smith-001";

/// Pid → identity (every pid not set is the operator); records binds.
#[derive(Default)]
pub struct Ids {
    map: Mutex<HashMap<u32, Identity>>,
    pub bound: Mutex<Vec<(u32, SmithIdx)>>,
}

impl Identities for Ids {
    fn resolve(&self, pid: u32) -> Identity {
        self.map
            .lock()
            .unwrap()
            .get(&pid)
            .copied()
            .unwrap_or(Identity::Operator)
    }
    fn bind(&self, pid: u32, smith: SmithIdx) -> Result<(), BindError> {
        if pid == 99 {
            return Err(BindError {
                errno: Errno::ESRCH,
                reason: "no such process 99".into(),
            });
        }
        self.bound.lock().unwrap().push((pid, smith));
        Ok(())
    }
    fn register_smith(&self, _smith: SmithIdx, _full_id: &FullId) {}
    fn mode_name(&self) -> &'static str {
        "test"
    }
}

/// A scheduler port that records every trigger; no run is ever live.
#[derive(Default)]
pub struct Recorder {
    pub triggers: Mutex<Vec<Trigger>>,
    pub attrs: Mutex<Vec<NodeId>>,
}

impl Scheduling for Recorder {
    fn trigger(&self, t: Trigger) {
        self.triggers.lock().unwrap().push(t);
    }
    fn status_json(&self) -> Option<String> {
        Some("{\"test\": true}\n".into())
    }
    fn subtree_live(&self, _smith: SmithIdx) -> bool {
        false
    }
}

impl AttrCache for Recorder {
    fn attrs_changed(&self, node: NodeId) {
        self.attrs.lock().unwrap().push(node);
    }
}

/// The store, the filesystem over it, and what it told the rest of the daemon.
pub struct World {
    pub dir: tempfile::TempDir,
    pub fs: Arc<SmithFs>,
    pub ids: Arc<Ids>,
    pub rec: Arc<Recorder>,
    pub child: SmithIdx,
}

impl World {
    /// `smithfs init`, then the operator scaffolds `smith-001` under the root smith.
    pub fn new() -> World {
        World::with_options(FsOptions::default())
    }

    /// [`World::new`] with the filesystem options `opts`.
    pub fn with_options(opts: FsOptions) -> World {
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new(SMITHFS)
            .arg("init")
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "init: {out:?}");
        let ids = Arc::new(Ids::default());
        let rec = Arc::new(Recorder::default());
        let root = backing::open_store_root(dir.path()).unwrap();
        let ports = Ports {
            sched: rec.clone(),
            kernel: rec.clone(),
            ..Ports::default()
        };
        let fs = SmithFs::with_ports(root, opts, ids.clone(), ports).unwrap();
        let children = walk(&fs, "smiths/smith-root/children");
        fs.mkdir(&OPERATOR, children, OsStr::new("smith-001"), 0o755)
            .unwrap();
        let root = fs.registry().by_full_id("smith-root").unwrap();
        let child = fs.registry().by_full_id("smith-root/smith-001").unwrap();
        ids.map.lock().unwrap().extend([
            (ROOT.pid, Identity::Smith(root)),
            (CHILD.pid, Identity::Smith(child)),
            (UNKNOWN.pid, Identity::Unknown),
        ]);
        World {
            dir,
            fs: Arc::new(fs),
            ids,
            rec,
            child,
        }
    }

    /// Node id of the mount-relative `path` (looked up part by part from the root).
    pub fn node(&self, path: &str) -> NodeId {
        walk(&self.fs, path)
    }

    /// The store's path of the mount-relative `rel`.
    pub fn store(&self, rel: &str) -> std::path::PathBuf {
        self.dir.path().join(rel)
    }

    /// The triggers sent so far (and forget them).
    pub fn take_triggers(&self) -> Vec<Trigger> {
        std::mem::take(&mut *self.rec.triggers.lock().unwrap())
    }

    /// Create `name` in `dir` as `who`, write `data`, release: the completion of §5.
    pub fn write_file(
        &self,
        who: &Caller,
        dir: NodeId,
        name: &str,
        data: &[u8],
    ) -> Result<(), Errno> {
        let (attr, fh) = self
            .fs
            .create(
                who,
                dir,
                OsStr::new(name),
                0o644,
                libc::O_WRONLY | libc::O_TRUNC,
            )
            .map_err(|e| e.errno())?;
        let ino = attr.node();
        self.fs
            .write(who, ino, fh, 0, data, false)
            .map_err(|e| e.errno())?;
        self.fs.release(ino, fh).map_err(|e| e.errno())?;
        Ok(())
    }

    /// The first line of `.smithfs/why` as `who` sees it.
    pub fn why(&self, who: &Caller) -> String {
        let ctl_dir = self.node(".smithfs");
        let (attr, _) = self.fs.lookup(ctl_dir, OsStr::new("why")).unwrap();
        let ino = attr.node();
        let (fh, _) = self.fs.open(who, ino, libc::O_RDONLY).unwrap();
        let data = self.fs.read(ino, fh, 0, 1 << 16).unwrap();
        self.fs.release(ino, fh).unwrap();
        String::from_utf8(data).unwrap()
    }
}

/// Look `path` up from the root, part by part.
pub fn walk(fs: &SmithFs, path: &str) -> NodeId {
    let mut dir = NodeId::ROOT;
    for part in path.split('/').filter(|p| !p.is_empty()) {
        let (attr, _) = fs
            .lookup(dir, OsStr::new(part))
            .unwrap_or_else(|e| panic!("lookup {part} of {path}: {e}"));
        dir = attr.node();
    }
    dir
}

/// The errno of a failed operation.
pub fn errno<T: std::fmt::Debug>(r: smithfs::fs::FsResult<T>) -> Errno {
    r.expect_err("the operation should fail").errno()
}
