//! One dispatcher from decoded FUSE requests ([`wire::Request`]) to [`SmithFs`] operations, the
//! one mapping of the operations that every framing uses: `/dev/fuse` ([`super::devfuse`]),
//! io_uring ([`super::uring`]) and the remote mount's connections (`crate::remote`,
//! docs/SPEC.md §13). A framing decodes, calls [`Dispatcher::dispatch`], and encodes the
//! [`Reply`], which carries everything the kernel needs (entry and attribute validity, open
//! flags, the passthrough backing of the local framings), so identity, policy, caching and
//! passthrough behave alike on every transport.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use super::wire::{self, fattr, EntryOut, FuseAttr, InHeader, Out, Request};
use crate::fs::{Attr, Cache, Caller, Fh, FsError, NodeId, SetAttr, SmithFs, XattrReply};

/// What a request's reply carries, built after the request's borrowed buffer is done with (a
/// transport may reuse one buffer for the request and its reply).
#[derive(Debug)]
pub enum Reply {
    /// `-errno` only (positive errno here).
    Error(i32),
    /// An empty success.
    Empty,
    /// `fuse_entry_out`.
    Entry(EntryOut),
    /// `fuse_attr_out`.
    Attr(u64, u32, FuseAttr),
    /// `fuse_open_out`: handle, `FOPEN_*` flags, backing id.
    Open(u64, u32, u32),
    /// CREATE: `fuse_entry_out` then `fuse_open_out`.
    Create(EntryOut, u64, u32, u32),
    /// Raw bytes: READ data, READLINK target, an xattr value or list, a READDIR body.
    Data(Vec<u8>),
    /// A READDIRPLUS body and the node ids of its entries, each of which the reply gave one
    /// lookup (every entry but `.` and `..`, as the kernel counts them): what a transport that
    /// keeps its own lookup counts (a remote connection) adds to them.
    Listing(Vec<u8>, Vec<NodeId>),
    /// `fuse_write_out`.
    Written(u32),
    /// `fuse_getxattr_out`.
    XattrSize(u32),
    /// `fuse_lseek_out`.
    Lseek(i64),
    /// `fuse_statfs_out`.
    Statfs(Box<libc::statvfs>),
    /// No reply is sent (FORGET).
    None,
}

impl Reply {
    /// Write the reply body into `out`; returns the error to put in `fuse_out_header` (0 or a
    /// negative errno). A body that does not fit becomes `-EIO` with no body.
    pub fn encode(&self, out: &mut Out<'_>) -> i32 {
        out.clear();
        match self {
            Reply::Error(e) => return -e,
            Reply::Empty | Reply::None => {}
            Reply::Entry(e) => out.entry(e),
            Reply::Attr(s, ns, a) => out.attr(*s, *ns, a),
            Reply::Open(fh, fl, b) => out.open(*fh, *fl, *b),
            Reply::Create(e, fh, fl, b) => {
                out.entry(e);
                out.open(*fh, *fl, *b);
            }
            Reply::Data(d) | Reply::Listing(d, _) => out.bytes(d),
            Reply::Written(n) => out.write(*n),
            Reply::XattrSize(n) => out.xattr_size(*n),
            Reply::Lseek(o) => out.lseek(*o),
            Reply::Statfs(s) => out.statfs(s),
        }
        if out.overflowed() {
            out.clear();
            FsError::ReplyFailed.log("reply");
            return -FsError::ReplyFailed.raw();
        }
        0
    }
}

/// A cache invalidation for the other kernels (docs/SPEC.md §13): what a request changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The node's attributes changed (`data`: and its contents).
    Node {
        /// The node.
        node: NodeId,
        /// Its contents changed too.
        data: bool,
    },
    /// A name in directory `parent` appeared, went or changed.
    Entry {
        /// The directory.
        parent: NodeId,
        /// The name.
        name: Vec<u8>,
    },
}

impl Change {
    /// The notification that tells a kernel of it (`FUSE_NOTIFY_INVAL_INODE`, or
    /// `FUSE_NOTIFY_INVAL_ENTRY`), as a `/dev/fuse` frame.
    pub fn frame(&self) -> Vec<u8> {
        match self {
            Change::Node { node, data } => super::devfuse::inval_inode(*node, *data),
            Change::Entry { parent, name } => super::devfuse::inval_entry(*parent, name),
        }
    }
}

/// What `req`, sent with header `h`, changes if it succeeds, for the other kernels' caches
/// (docs/PROTOCOL-NOTES.md R9, R40): the entries made, removed or renamed and their
/// directories, and the nodes whose attributes or data changed — data written through the
/// daemon at each WRITE, a truncating OPEN, and at the RELEASE of a handle opened for writing,
/// which is when a writer's passthrough writes (which never reach the daemon) are told.
pub fn changes_of(h: &InHeader, req: &Request<'_>) -> Vec<Change> {
    let node = |n: u64, data: bool| Change::Node {
        node: NodeId(n),
        data,
    };
    let entry = |parent: u64, name: &std::ffi::OsStr| Change::Entry {
        parent: NodeId(parent),
        name: name.as_bytes().to_vec(),
    };
    let dir = h.nodeid;
    let writes = |flags: u32| flags & libc::O_ACCMODE as u32 != libc::O_RDONLY as u32;
    match req {
        Request::Setattr(s) => vec![node(dir, s.valid & wire::fattr::SIZE != 0)],
        Request::Write { .. } | Request::Fallocate { .. } => vec![node(dir, true)],
        Request::Open { flags } if flags & libc::O_TRUNC as u32 != 0 => vec![node(dir, true)],
        Request::Release { flags, .. } if writes(*flags) => vec![node(dir, true)],
        Request::Setxattr { .. } | Request::Removexattr { .. } => vec![node(dir, false)],
        Request::CopyFileRange { nodeid_out, .. } => vec![node(*nodeid_out, true)],
        Request::Create { name, .. }
        | Request::Mknod { name, .. }
        | Request::Mkdir { name, .. }
        | Request::Symlink { name, .. }
        | Request::Unlink { name }
        | Request::Rmdir { name } => vec![entry(dir, name), node(dir, false)],
        Request::Link {
            oldnodeid, newname, ..
        } => vec![
            entry(dir, newname),
            node(dir, false),
            node(*oldnodeid, false),
        ],
        Request::Rename {
            newdir,
            name,
            newname,
            ..
        } => vec![
            entry(dir, name),
            entry(*newdir, newname),
            node(dir, false),
            node(*newdir, false),
        ],
        _ => Vec::new(),
    }
}

/// Which kernel a request came from: what it changed is told to every kernel but this one,
/// which changed it through its own requests and knows (docs/PROTOCOL-NOTES.md R9, R40).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The daemon's own mount, whatever its framing (`/dev/fuse` or io_uring).
    Local,
    /// The remote connection with this id (the listener's, `remote::listener::Peers`).
    Remote(u64),
}

/// Where a dispatcher tells what its requests changed ([`Dispatcher::with_changes`]): the one
/// sink of every framing, which tells every kernel caching the tree but the one the request
/// came from (the daemon's `Kernels`: its own mount and every remote connection; a listener
/// without a daemon: its connections, `remote::listener::Peers`).
pub trait Changes: Send + Sync + std::fmt::Debug {
    /// Whether a kernel other than `from` may have to be told by the time a request of `from`
    /// is served; while not, nothing is computed. Asked on every request: no lock.
    fn listening(&self, from: Origin) -> bool;
    /// A request from `from` made `change`: tell every kernel but `from`. Called on the
    /// serving thread: queue it, never wait for a network write.
    fn changed(&self, from: Origin, change: &Change);
}

/// Validity, in the kernel's caches, of entries and attributes of ordinary backing-store inodes
/// (seconds; one day, as libfuse's passthrough_hp): every change that does not come through the
/// kernel's own requests is invalidated by the daemon (docs/PROTOCOL-NOTES.md C4, U4).
pub const TTL_SECS: u64 = 86_400;

/// Entry/attribute validity for `cache`, in seconds: [`TTL_SECS`] for [`Cache::Normal`], 1 for
/// [`Cache::Brief`], 0 for [`Cache::Volatile`] and [`Cache::Never`].
pub fn ttl_secs(cache: Cache) -> u64 {
    match cache {
        Cache::Normal => TTL_SECS,
        Cache::Brief => 1,
        Cache::Volatile | Cache::Never => 0,
    }
}

/// `r`'s attributes with the cache validity of the node they describe ([`SmithFs::cache_of`]).
pub fn cached(fs: &SmithFs, r: Result<Attr, FsError>) -> Result<(Attr, Cache), FsError> {
    r.map(|a| {
        let c = fs.cache_of(NodeId(a.0.st_ino));
        (a, c)
    })
}

/// The longest a node's kernel may keep an entry or attributes it got over a remote connection,
/// in seconds (docs/SPEC.md §13, notes R40): as long as the daemon's own kernel ([`TTL_SECS`]).
/// Every change reaches a node as it happens: one made over another connection, by the
/// scheduler, by the filesystem itself, or through the daemon's own mount by a local process
/// ([`Changes`]; a local writer's passthrough writes at its close: close-to-open). Data is
/// close-to-open anyway (no open of a node keeps its page cache, [`fopen_bits`]).
pub const REMOTE_TTL_SECS: u64 = TTL_SECS;

/// `FOPEN_*` flags for an opendir of a directory whose entries may be cached as `cache`: a
/// directory cached like its entries (`Cache::Normal`) keeps its listing in the kernel
/// (`FOPEN_CACHE_DIR | FOPEN_KEEP_CACHE`), so a second listing sends only OPENDIR (the access
/// check, every time) and RELEASEDIR. The kernel drops that listing itself when the directory
/// changes through the mount (its change counter) or its mtime changes (refetched after every
/// invalidation the daemon sends for its own writes, docs/PROTOCOL-NOTES.md U4, U10). A listing
/// is the same for every caller, so a cached one tells nobody more than a fresh one.
pub fn opendir_bits(cache: Cache) -> u32 {
    match cache {
        Cache::Normal => wire::fopen::CACHE_DIR | wire::fopen::KEEP_CACHE,
        Cache::Brief | Cache::Volatile | Cache::Never => 0,
    }
}

/// `FOPEN_*` flags for an open whose data may be cached as `cache`.
pub fn fopen_bits(cache: Cache) -> u32 {
    match cache {
        // Nothing is buffered in the daemon and locks are the kernel's: a close needs no FLUSH.
        Cache::Normal | Cache::Brief | Cache::Volatile => wire::fopen::NOFLUSH,
        Cache::Never => wire::fopen::DIRECT_IO,
    }
}

/// A passthrough registration made on the FUSE device (`FUSE_DEV_IOC_BACKING_OPEN`), closed
/// when the last handle sharing it is released.
#[derive(Debug)]
struct DevBacking {
    dev: Arc<OwnedFd>,
    id: u32,
}

impl Drop for DevBacking {
    fn drop(&mut self) {
        if let Err(e) = super::devfuse::backing_close(self.dev.as_fd(), self.id) {
            tracing::debug!("FUSE_DEV_IOC_BACKING_CLOSE {}: {e}", self.id);
        }
    }
}

/// Routes decoded requests to [`SmithFs`].
#[derive(Debug)]
pub struct Dispatcher {
    fs: Arc<SmithFs>,
    /// Passthrough was granted at INIT (never over a remote connection).
    passthrough: bool,
    /// `Some(uid)`: only this uid (the daemon's) may issue requests other than the ones the
    /// kernel sends without a caller (what the kernel's `allow_other` leaves to the daemon;
    /// libfuse's and fuser's default).
    owner: Option<u32>,
    /// The FUSE device, for passthrough registrations; `None` for a remote connection.
    dev: Option<Arc<OwnedFd>>,
    /// `Some`: every request is this caller's, whatever its header says (a remote connection
    /// judged as its run's smith, docs/SPEC.md §13); `None`: the header's pid, uid and gid.
    vouched: Option<Caller>,
    /// The longest entry and attribute validity a reply gives, in seconds ([`REMOTE_TTL_SECS`]
    /// for a remote connection, else unbounded).
    ttl_cap: u64,
    /// Where what a request changed is told, and which kernel this dispatcher serves.
    changes: Option<(Arc<dyn Changes>, Origin)>,
}

impl Dispatcher {
    /// A dispatcher into `fs` for the daemon's own mount, whose connection is `dev`.
    pub fn new(fs: Arc<SmithFs>, passthrough: bool, owner: Option<u32>, dev: Arc<OwnedFd>) -> Self {
        Dispatcher {
            fs,
            passthrough,
            owner,
            dev: Some(dev),
            vouched: None,
            ttl_cap: u64::MAX,
            changes: None,
        }
    }

    /// A dispatcher into `fs` for a remote connection that proved it is `caller` (its
    /// `as_smith` set, its pid 0: no pid is looked up; docs/SPEC.md §13): every request is
    /// judged as `caller`, nothing is passed through.
    pub fn vouched(fs: Arc<SmithFs>, caller: Caller) -> Self {
        Dispatcher {
            fs,
            passthrough: false,
            owner: None,
            dev: None,
            vouched: Some(caller),
            ttl_cap: REMOTE_TTL_SECS,
            changes: None,
        }
    }

    /// Tell `sink` what each request changes once it succeeded ([`changes_of`]), as a request
    /// of the kernel `from` (whom `sink` does not tell).
    pub fn with_changes(mut self, sink: Arc<dyn Changes>, from: Origin) -> Self {
        self.changes = Some((sink, from));
        self
    }

    /// The filesystem requests are routed to.
    pub fn fs(&self) -> &Arc<SmithFs> {
        &self.fs
    }

    /// Entry and attribute validity for `cache` through this dispatcher, in seconds.
    fn ttl(&self, cache: Cache) -> u64 {
        ttl_secs(cache).min(self.ttl_cap)
    }

    fn entry(&self, r: Result<(Attr, Cache), FsError>) -> Reply {
        match r {
            Ok((a, c)) => Reply::Entry(entry_out(&a, self.ttl(c))),
            Err(e) => err(&e),
        }
    }

    fn backing(&self, fh: Fh) -> u32 {
        let (true, Some(dev)) = (self.passthrough, self.dev.clone()) else {
            return 0;
        };
        let made = self.fs.passthrough(fh, |fd: BorrowedFd<'_>| {
            let id = super::devfuse::backing_open(dev.as_fd(), fd)?;
            Ok(Arc::new(DevBacking { dev, id }) as crate::fs::BackingRef)
        });
        made.and_then(|b| b.downcast::<DevBacking>().ok())
            .map_or(0, |b| b.id)
    }

    /// Serve one request from `h` with body `req`; what it changed, once it succeeded, is told
    /// to the dispatcher's [`Changes`].
    pub fn dispatch(&self, h: &InHeader, req: Request<'_>) -> Reply {
        let Some((sink, from)) = self.changes.as_ref().filter(|(s, f)| s.listening(*f)) else {
            return self.serve(h, req);
        };
        let changes = changes_of(h, &req);
        let reply = self.serve(h, req);
        if !matches!(reply, Reply::Error(_)) {
            for c in &changes {
                sink.changed(*from, c);
            }
        }
        reply
    }

    /// Serve one request as the kernel framed it (`h`, the operation's fixed argument `arg`,
    /// its `payload`): decoded, dispatched, a panic of its handler caught and answered EIO, an
    /// undecodable one answered EINVAL (logged) — what every framing of the local mount does.
    pub fn serve_framed(&self, h: &InHeader, arg: &[u8], payload: &[u8]) -> Reply {
        match Request::decode(h.opcode, arg, payload) {
            Ok(req) => {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.dispatch(h, req)))
                    .unwrap_or_else(|_| {
                        tracing::error!(opcode = h.opcode, "request handler panicked");
                        Reply::Error(FsError::ReplyFailed.raw())
                    })
            }
            Err(err) => {
                tracing::warn!(opcode = h.opcode, "undecodable FUSE request: {err}");
                Reply::Error(FsError::BadRequest.raw())
            }
        }
    }

    /// Serve one request from `h` with body `req`.
    fn serve(&self, h: &InHeader, req: Request<'_>) -> Reply {
        let c = self.vouched.unwrap_or(Caller {
            pid: h.pid,
            uid: h.uid,
            gid: h.gid,
            as_smith: None,
        });
        let ino = NodeId(h.nodeid);
        if let Some(owner) = self.owner {
            let kernel_only = matches!(
                req,
                Request::Destroy
                    | Request::Read { .. }
                    | Request::Readdir { .. }
                    | Request::Readdirplus { .. }
                    | Request::Forget { .. }
                    | Request::Write { .. }
                    | Request::Fsync { .. }
                    | Request::Fsyncdir { .. }
                    | Request::Release { .. }
                    | Request::Releasedir { .. }
            );
            if h.uid != owner && !kernel_only {
                return err(&FsError::NotOwner);
            }
        }
        let fs = &self.fs;
        match req {
            Request::Lookup { name } => self.entry(fs.lookup_entry(&c, ino, name)),
            Request::Forget { nlookup } => {
                fs.forget(ino, nlookup);
                Reply::None
            }
            Request::Getattr { fh } => match fs.getattr(ino, fh.map(Fh)) {
                Ok(a) => attr(&a, self.ttl(fs.cache_of(ino))),
                Err(e) => err(&e),
            },
            Request::Setattr(s) => {
                let time = |now: u32, set: u32, sec: u64, nsec: u32| {
                    if s.valid & now != 0 {
                        Some(libc::timespec {
                            tv_sec: 0,
                            tv_nsec: libc::UTIME_NOW,
                        })
                    } else if s.valid & set != 0 {
                        Some(libc::timespec {
                            tv_sec: sec as i64,
                            tv_nsec: i64::from(nsec),
                        })
                    } else {
                        None
                    }
                };
                let set = SetAttr {
                    mode: (s.valid & fattr::MODE != 0).then_some(s.mode),
                    uid: (s.valid & fattr::UID != 0).then_some(s.uid),
                    gid: (s.valid & fattr::GID != 0).then_some(s.gid),
                    size: (s.valid & fattr::SIZE != 0).then_some(s.size),
                    atime: time(fattr::ATIME_NOW, fattr::ATIME, s.atime, s.atimensec),
                    mtime: time(fattr::MTIME_NOW, fattr::MTIME, s.mtime, s.mtimensec),
                    fh: (s.valid & fattr::FH != 0).then_some(Fh(s.fh)),
                };
                match fs.setattr(&c, ino, &set) {
                    Ok(a) => attr(&a, self.ttl(fs.cache_of(ino))),
                    Err(e) => err(&e),
                }
            }
            Request::Readlink => data(fs.readlink(&c, ino)),
            Request::Symlink { name, target } => {
                self.entry(cached(fs, fs.symlink(&c, ino, name, target)))
            }
            Request::Mknod {
                mode, rdev, name, ..
            } => self.entry(cached(fs, fs.mknod(&c, ino, name, mode, rdev))),
            Request::Mkdir { mode, name, .. } => {
                self.entry(cached(fs, fs.mkdir(&c, ino, name, mode)))
            }
            Request::Unlink { name } => empty(fs.remove(&c, ino, name, false)),
            Request::Rmdir { name } => empty(fs.remove(&c, ino, name, true)),
            Request::Rename {
                newdir,
                flags,
                name,
                newname,
            } => empty(fs.rename(&c, ino, name, NodeId(newdir), newname, flags)),
            Request::Link { oldnodeid, newname } => {
                self.entry(cached(fs, fs.link(&c, NodeId(oldnodeid), ino, newname)))
            }
            Request::Open { flags } => match fs.open(&c, ino, flags as i32) {
                Ok((fh, cache)) => {
                    let backing = match cache {
                        Cache::Normal | Cache::Brief | Cache::Volatile => self.backing(fh),
                        Cache::Never => 0,
                    };
                    Reply::Open(fh.0, open_flags(cache, backing), backing)
                }
                Err(e) => err(&e),
            },
            Request::Read {
                fh, offset, size, ..
            } => data(fs.read(ino, Fh(fh), offset, size)),
            Request::Write {
                fh,
                offset,
                write_flags,
                data,
            } => {
                let kill = write_flags & wire::WRITE_KILL_SUIDGID != 0;
                match fs.write(&c, ino, Fh(fh), offset, data, kill) {
                    Ok(n) => Reply::Written(n),
                    Err(e) => err(&e),
                }
            }
            Request::Statfs => match fs.statfs(ino) {
                Ok(s) => Reply::Statfs(Box::new(s)),
                Err(e) => err(&e),
            },
            Request::Release { fh, .. } => empty(fs.release(ino, Fh(fh))),
            Request::Fsync { fh, datasync } => empty(fs.fsync(ino, Fh(fh), datasync)),
            Request::Setxattr { flags, name, value } => {
                empty(fs.setxattr(&c, ino, name, value, flags as i32))
            }
            Request::Getxattr { size, name } => xattr(fs.getxattr(&c, ino, name, size)),
            Request::Listxattr { size } => xattr(fs.listxattr(&c, ino, size)),
            Request::Removexattr { name } => empty(fs.removexattr(&c, ino, name)),
            Request::Flush { fh } => empty(fs.flush(ino, Fh(fh))),
            Request::Opendir { .. } => match fs.opendir(&c, ino) {
                Ok(fh) => Reply::Open(fh.0, opendir_bits(fs.cache_of(ino)), 0),
                Err(e) => err(&e),
            },
            Request::Readdir { fh, offset, size } => {
                listing(fs, ino, Fh(fh), offset, size, false, self.ttl_cap)
            }
            Request::Readdirplus { fh, offset, size } => {
                listing(fs, ino, Fh(fh), offset, size, true, self.ttl_cap)
            }
            Request::Releasedir { fh } => empty(fs.releasedir(ino, Fh(fh))),
            Request::Fsyncdir { fh, datasync } => empty(fs.fsyncdir(ino, Fh(fh), datasync)),
            // With `default_permissions` the kernel checks mode bits itself; without it (a uid per
            // smith) the rules alone decide, checked on the operation itself (docs/SPEC.md §3).
            Request::Access { .. } => Reply::Empty,
            Request::Create {
                flags, mode, name, ..
            } => match fs.create(&c, ino, name, mode, flags as i32) {
                Ok((a, fh)) => {
                    let backing = self.backing(fh);
                    Reply::Create(
                        entry_out(&a, self.ttl(fs.cache_of(NodeId(a.0.st_ino)))),
                        fh.0,
                        open_flags(Cache::Normal, backing),
                        backing,
                    )
                }
                Err(e) => err(&e),
            },
            // Requests run to their end: ENOSYS tells the kernel to send no more INTERRUPTs.
            Request::Interrupt { .. } => err(&FsError::Unimplemented),
            Request::Fallocate {
                fh,
                offset,
                length,
                mode,
            } => empty(fs.fallocate(Fh(fh), offset, length, mode as i32)),
            Request::Lseek { fh, offset, whence } => {
                match fs.lseek(ino, Fh(fh), offset, whence as i32) {
                    Ok(o) => Reply::Lseek(o),
                    Err(e) => err(&e),
                }
            }
            Request::CopyFileRange {
                fh_in,
                off_in,
                fh_out,
                off_out,
                len,
                ..
            } => match fs.copy_file_range(Fh(fh_in), off_in, Fh(fh_out), off_out, len, 0) {
                Ok(n) => Reply::Written(n),
                Err(e) => err(&e),
            },
            Request::Destroy => Reply::Empty,
            Request::Other(_) => err(&FsError::Unimplemented),
        }
    }
}

/// A READDIR (`plus` false) or READDIRPLUS body of at most `size` bytes from `offset`, its
/// entries valid for at most `ttl_cap` seconds.
fn listing(
    fs: &SmithFs,
    ino: NodeId,
    fh: Fh,
    offset: u64,
    size: u32,
    plus: bool,
    ttl_cap: u64,
) -> Reply {
    let mut buf = vec![0u8; size as usize];
    let mut out = Out::new(&mut buf);
    let mut looked_up = Vec::new();
    let r = fs.readdir(ino, fh, offset, plus, |e| {
        let name = e.name.as_bytes();
        if !plus {
            return out.dirent(size as usize, e.ino.0, e.offset, e.kind, name);
        }
        // `SmithFs::readdir` gives every entry its attributes when asked for `plus`.
        let Some(a) = e.attr else {
            return false;
        };
        let mut entry = entry_out(&a, ttl_secs(fs.cache_of(e.ino)).min(ttl_cap));
        entry.nodeid = e.ino.0;
        let full = out.direntplus(size as usize, &entry, e.offset, name);
        if !full && name != b"." && name != b".." {
            looked_up.push(e.ino);
        }
        full
    });
    let n = out.len();
    match r {
        Ok(()) if plus => {
            buf.truncate(n);
            Reply::Listing(buf, looked_up)
        }
        Ok(()) => {
            buf.truncate(n);
            Reply::Data(buf)
        }
        Err(e) => err(&e),
    }
}

fn open_flags(cache: Cache, backing: u32) -> u32 {
    let mut f = fopen_bits(cache);
    if backing != 0 {
        f |= wire::fopen::PASSTHROUGH;
    }
    f
}

fn err(e: &FsError) -> Reply {
    Reply::Error(e.raw())
}

fn entry_out(a: &Attr, ttl: u64) -> EntryOut {
    EntryOut {
        nodeid: a.0.st_ino,
        generation: 0,
        entry_valid: ttl,
        attr_valid: ttl,
        entry_valid_nsec: 0,
        attr_valid_nsec: 0,
        attr: FuseAttr::from_stat(&a.0),
    }
}

fn attr(a: &Attr, ttl: u64) -> Reply {
    Reply::Attr(ttl, 0, FuseAttr::from_stat(&a.0))
}

fn empty(r: Result<(), FsError>) -> Reply {
    match r {
        Ok(()) => Reply::Empty,
        Err(e) => err(&e),
    }
}

fn data(r: Result<Vec<u8>, FsError>) -> Reply {
    match r {
        Ok(d) => Reply::Data(d),
        Err(e) => err(&e),
    }
}

fn xattr(r: Result<XattrReply, FsError>) -> Reply {
    match r {
        Ok(XattrReply::Size(n)) => Reply::XattrSize(n),
        Ok(XattrReply::Data(d)) => Reply::Data(d),
        Err(e) => err(&e),
    }
}
