//! FUSE glue: the only place that names fuser's request and reply types. Each method builds a
//! [`Caller`], calls [`SmithFs`], and replies (STYLE.md habit 1).

pub mod mount;
pub mod session;

use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, BackingId, BsdFileFlags, CopyFileRangeFlags, Errno, FileAttr, FileHandle,
    FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig,
    LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use crate::fs::{Attr, Cache, Caller, Fh, FsError, NodeId, SetAttr, SmithFs, XattrReply};

pub mod dispatch;
pub mod transport;
pub mod uring;
pub mod wire;

use transport::{Negotiated, Transport};

/// Largest write the kernel sends in one request.
const MAX_WRITE: u32 = 1 << 20;

/// The `fuser::Filesystem` adapter around [`SmithFs`].
#[derive(Debug)]
pub struct FuseFs {
    fs: Arc<SmithFs>,
    /// Use FUSE passthrough for regular files: asked for by the mount and granted by the kernel
    /// (decided once, at init).
    passthrough: bool,
    /// The transport asked for (`mount --transport`).
    transport: Transport,
    /// What INIT settled, for the mount to read.
    negotiated: Arc<Negotiated>,
}

impl FuseFs {
    /// Serve `fs` over FUSE; `passthrough` asks for kernel passthrough of regular files (needs
    /// CAP_SYS_ADMIN and kernel ≥ 6.9).
    pub fn new(fs: Arc<SmithFs>, passthrough: bool) -> FuseFs {
        FuseFs {
            fs,
            passthrough,
            transport: Transport::DevFuse,
            negotiated: Arc::default(),
        }
    }

    /// Ask for `transport` at INIT and record there what was settled in `negotiated`.
    pub fn with_transport(mut self, transport: Transport, negotiated: Arc<Negotiated>) -> Self {
        self.transport = transport;
        self.negotiated = negotiated;
        self
    }

    /// The shared backing registration for handle `fh`, made through `open_backing`.
    fn backing_for(
        &self,
        fh: Fh,
        open_backing: impl FnOnce(std::os::fd::BorrowedFd<'_>) -> std::io::Result<BackingId>,
    ) -> Option<Arc<BackingId>> {
        if !self.passthrough {
            return None;
        }
        let any = self.fs.passthrough(fh, |fd| {
            open_backing(fd).map(|b| Arc::new(b) as crate::fs::BackingRef)
        })?;
        any.downcast::<BackingId>().ok()
    }
}

/// Our node id for fuser's.
fn node(ino: INodeNo) -> NodeId {
    NodeId(ino.0)
}

/// Our open-file number for fuser's.
fn fh_no(fh: FileHandle) -> Fh {
    Fh(fh.0)
}

fn caller(req: &Request) -> Caller {
    Caller {
        pid: req.pid(),
        uid: req.uid(),
        gid: req.gid(),
        as_smith: None,
    }
}

fn errno(e: &FsError) -> Errno {
    Errno::from_i32(e.raw())
}

fn time(sec: i64, nsec: i64) -> SystemTime {
    if sec >= 0 {
        UNIX_EPOCH + Duration::new(sec as u64, nsec as u32)
    } else {
        UNIX_EPOCH - Duration::new(sec.unsigned_abs(), 0) + Duration::new(0, nsec as u32)
    }
}

fn file_type(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

/// Convert the mount's view of a backing `stat` into fuser's attribute record.
fn file_attr(a: &Attr) -> FileAttr {
    let st = &a.0;
    FileAttr {
        ino: INodeNo(st.st_ino),
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        atime: time(st.st_atime, st.st_atime_nsec),
        mtime: time(st.st_mtime, st.st_mtime_nsec),
        ctime: time(st.st_ctime, st.st_ctime_nsec),
        crtime: UNIX_EPOCH,
        kind: file_type(st.st_mode),
        perm: (st.st_mode & 0o7777) as u16,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev as u32,
        blksize: st.st_blksize as u32,
        flags: 0,
    }
}

fn timespec(t: TimeOrNow) -> libc::timespec {
    match t {
        TimeOrNow::Now => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        TimeOrNow::SpecificTime(st) => match st.duration_since(UNIX_EPOCH) {
            Ok(d) => libc::timespec {
                tv_sec: d.as_secs() as i64,
                tv_nsec: i64::from(d.subsec_nanos()),
            },
            Err(e) => {
                let d = e.duration();
                let mut sec = -(d.as_secs() as i64);
                let mut nsec = -i64::from(d.subsec_nanos());
                if nsec < 0 {
                    sec -= 1;
                    nsec += 1_000_000_000;
                }
                libc::timespec {
                    tv_sec: sec,
                    tv_nsec: nsec,
                }
            }
        },
    }
}

fn ttl(cache: Cache) -> Duration {
    Duration::from_secs(dispatch::ttl_secs(cache))
}

fn fopen(cache: Cache) -> FopenFlags {
    FopenFlags::from_bits_retain(dispatch::fopen_bits(cache))
}

fn reply_entry(fs: &SmithFs, reply: ReplyEntry, r: Result<Attr, FsError>) {
    reply_entry_cached(reply, dispatch::cached(fs, r));
}

fn reply_entry_cached(reply: ReplyEntry, r: Result<(Attr, Cache), FsError>) {
    match r {
        Ok((a, c)) => reply.entry(&ttl(c), &file_attr(&a), Generation(0)),
        Err(e) => reply.error(errno(&e)),
    }
}

fn reply_empty(reply: ReplyEmpty, r: Result<(), FsError>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(&e)),
    }
}

fn reply_xattr(reply: ReplyXattr, r: Result<XattrReply, FsError>) {
    match r {
        Ok(XattrReply::Size(n)) => reply.size(n),
        Ok(XattrReply::Data(d)) => reply.data(&d),
        Err(e) => reply.error(errno(&e)),
    }
}

impl Filesystem for FuseFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let mut wanted = InitFlags::FUSE_ATOMIC_O_TRUNC
            | InitFlags::FUSE_HANDLE_KILLPRIV_V2
            | InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_AUTO_INVAL_DATA
            | InitFlags::FUSE_BIG_WRITES
            | InitFlags::FUSE_MAX_PAGES;
        if self.passthrough {
            if config.capabilities().contains(InitFlags::FUSE_PASSTHROUGH)
                && config.set_max_stack_depth(1).is_ok()
            {
                wanted |= InitFlags::FUSE_PASSTHROUGH;
            } else {
                self.passthrough = false;
            }
        }
        // The kernel offers io_uring only while the machine-wide `enable_uring` is on.
        let uring_offered = config
            .capabilities()
            .contains(InitFlags::FUSE_OVER_IO_URING);
        let io_uring = match self.transport {
            Transport::DevFuse => false,
            Transport::Auto => uring_offered,
            Transport::IoUring if uring_offered => true,
            Transport::IoUring => {
                tracing::error!(
                    "--transport io-uring: the kernel does not offer FUSE over io_uring ({} is off, or the kernel lacks CONFIG_FUSE_IO_URING); see `smithfs doctor`",
                    transport::ENABLE_URING
                );
                return Err(std::io::Error::from_raw_os_error(FsError::NoUring.raw()));
            }
        };
        if io_uring {
            wanted |= InitFlags::FUSE_OVER_IO_URING;
        }
        let available = config.capabilities() & wanted;
        if let Err(missing) = config.add_capabilities(available) {
            tracing::warn!(?missing, "kernel refused FUSE capabilities");
        }
        let mut max_write = MAX_WRITE;
        if let Err(max) = config.set_max_write(MAX_WRITE) {
            let _ = config.set_max_write(max);
            max_write = max;
        }
        let mut readahead = MAX_WRITE;
        if let Err(max) = config.set_max_readahead(MAX_WRITE) {
            readahead = max;
        }
        let _ = config.set_max_background(64);
        // fuser's INIT reply asks for max(max_write, max_readahead) in 4 KiB pages.
        let max_pages = (max_write.max(readahead).saturating_sub(1) / 4096) + 1;
        let n = &self.negotiated;
        n.io_uring
            .store(io_uring, std::sync::atomic::Ordering::Relaxed);
        n.passthrough
            .store(self.passthrough, std::sync::atomic::Ordering::Relaxed);
        n.max_write
            .store(max_write, std::sync::atomic::Ordering::Relaxed);
        n.max_pages
            .store(max_pages, std::sync::atomic::Ordering::Relaxed);
        tracing::info!(capabilities = ?available, passthrough = self.passthrough, transport = n.transport_name(), "FUSE session initialised");
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        reply_entry_cached(
            reply,
            self.fs.lookup_entry(&caller(req), node(parent), name),
        );
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        // Over io_uring only FORGET and INTERRUPT still come here: deferrable work, which
        // follows the queue threads' policy (docs/PROTOCOL-NOTES.md U8).
        uring::follow_headroom();
        self.fs.forget(node(ino), nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.fs.getattr(node(ino), fh.map(fh_no)) {
            Ok(a) => reply.attr(&ttl(self.fs.cache_of(node(ino))), &file_attr(&a)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(timespec),
            mtime: mtime.map(timespec),
            fh: fh.map(fh_no),
        };
        match self.fs.setattr(&caller(req), node(ino), &set) {
            Ok(a) => reply.attr(&ttl(self.fs.cache_of(node(ino))), &file_attr(&a)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.fs.readlink(&caller(req), node(ino)) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        reply_entry(
            &self.fs,
            reply,
            self.fs.mknod(&caller(req), node(parent), name, mode, rdev),
        );
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        reply_entry(
            &self.fs,
            reply,
            self.fs.mkdir(&caller(req), node(parent), name, mode),
        );
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(
            reply,
            self.fs.remove(&caller(req), node(parent), name, false),
        );
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(
            reply,
            self.fs.remove(&caller(req), node(parent), name, true),
        );
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        reply_entry(
            &self.fs,
            reply,
            self.fs
                .symlink(&caller(req), node(parent), link_name, target.as_os_str()),
        );
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply_empty(
            reply,
            self.fs.rename(
                &caller(req),
                node(parent),
                name,
                node(newparent),
                newname,
                flags.bits(),
            ),
        );
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply_entry(
            &self.fs,
            reply,
            self.fs
                .link(&caller(req), node(ino), node(newparent), newname),
        );
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.fs.open(&caller(req), node(ino), flags.0) {
            Ok((fh, cache)) => {
                let backing = match cache {
                    Cache::Normal | Cache::Brief | Cache::Volatile => {
                        self.backing_for(fh, |fd| reply.open_backing(fd))
                    }
                    Cache::Never => None,
                };
                match backing {
                    Some(b) => reply.opened_passthrough(FileHandle(fh.0), fopen(cache), &b),
                    None => reply.opened(FileHandle(fh.0), fopen(cache)),
                }
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.fs.read(node(ino), fh_no(fh), offset, size) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        match self
            .fs
            .write(&caller(req), node(ino), fh_no(fh), offset, data, kill)
        {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, self.fs.flush(node(ino), fh_no(fh)));
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, self.fs.release(node(ino), fh_no(fh)));
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, self.fs.fsync(node(ino), fh_no(fh), datasync));
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.fs.opendir(&caller(req), node(ino)) {
            Ok(fh) => reply.opened(
                FileHandle(fh.0),
                FopenFlags::from_bits_retain(dispatch::opendir_bits(self.fs.cache_of(node(ino)))),
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let r = self.fs.readdir(node(ino), fh_no(fh), offset, false, |e| {
            reply.add(INodeNo(e.ino.0), e.offset, file_type(e.kind), e.name)
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let r = self.fs.readdir(node(ino), fh_no(fh), offset, true, |e| {
            // `SmithFs::readdir` gives every entry its attributes when asked for `plus`.
            let Some(attr) = e.attr.map(|a| file_attr(&a)) else {
                return false;
            };
            reply.add(
                INodeNo(e.ino.0),
                e.offset,
                e.name,
                &ttl(self.fs.cache_of(e.ino)),
                &attr,
                Generation(0),
            )
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, self.fs.releasedir(node(ino), fh_no(fh)));
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, self.fs.fsyncdir(node(ino), fh_no(fh), datasync));
    }

    fn statfs(&self, _req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        match self.fs.statfs(node(ino)) {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                s.f_bsize as u32,
                s.f_namemax as u32,
                s.f_frsize as u32,
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply_empty(
            reply,
            self.fs
                .setxattr(&caller(req), node(ino), name, value, flags),
        );
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        reply_xattr(reply, self.fs.getxattr(&caller(req), node(ino), name, size));
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        reply_xattr(reply, self.fs.listxattr(&caller(req), node(ino), size));
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.fs.removexattr(&caller(req), node(ino), name));
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // With `default_permissions` the kernel checks mode bits itself; without it (a uid per
        // smith) the rules alone decide, checked on the operation itself (docs/SPEC.md §3).
        reply.ok();
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        match self
            .fs
            .create(&caller(req), node(parent), name, mode, flags)
        {
            Ok((a, fh)) => match self.backing_for(fh, |fd| reply.open_backing(fd)) {
                // A new file's entry and attributes, cached as its node's ([`SmithFs::cache_of`]).
                Some(b) => reply.created_passthrough(
                    &ttl(self.fs.cache_of(NodeId(a.0.st_ino))),
                    &file_attr(&a),
                    Generation(0),
                    FileHandle(fh.0),
                    fopen(Cache::Normal),
                    &b,
                ),
                None => reply.created(
                    &ttl(self.fs.cache_of(NodeId(a.0.st_ino))),
                    &file_attr(&a),
                    Generation(0),
                    FileHandle(fh.0),
                    fopen(Cache::Normal),
                ),
            },
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, self.fs.fallocate(fh_no(fh), offset, length, mode));
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        match self.fs.lseek(node(ino), fh_no(fh), offset, whence) {
            Ok(o) => reply.offset(o),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// No ioctl is served (the kernel's answer to the caller is ENOTTY), and quietly: fuser's
    /// default logs a warning per call, which let any smith grow the daemon's log without
    /// bound (notes H15).
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(Errno::from_i32(libc::ENOTTY));
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        _ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        match self
            .fs
            .copy_file_range(fh_no(fh_in), offset_in, fh_no(fh_out), offset_out, len, 0)
        {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(errno(&e)),
        }
    }
}
