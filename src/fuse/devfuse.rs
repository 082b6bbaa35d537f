//! The `/dev/fuse` framing: worker threads that each read one request at a time from their own
//! clone of the connection's descriptor (`FUSE_DEV_IOC_CLONE`, so the kernel hands requests to
//! the threads in parallel, as libfuse's `clone_fd`), decode it with the codec
//! ([`wire::split_dev_fuse`], [`Dispatcher::serve_framed`]), serve it with the one [`Dispatcher`] every
//! framing shares, and write the reply (`fuse_out_header` and the body) back. With FUSE over
//! io_uring they still serve what the kernel sends on `/dev/fuse` (FORGET, BATCH_FORGET,
//! INTERRUPT). Also here: the device's ioctls (clone, passthrough backing registrations) and
//! the cache notifications written to it.
//!
//! Reads end as libfuse's do: `ENOENT` (the request was interrupted before it was read),
//! `EINTR` and `EAGAIN` are retried; `ENODEV` means the mount is gone and the thread ends. A
//! reply whose caller gave up meanwhile is refused with `ENOENT`: dropped.

use std::io::IoSlice;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::dispatch::{Dispatcher, Reply};
use super::wire::{self, opcode, Out};
use crate::fs::NodeId;

/// `FUSE_DEV_IOC_CLONE` = `_IOR(229, 0, uint32_t)` (`include/uapi/linux/fuse.h`).
const FUSE_DEV_IOC_CLONE: libc::c_ulong = (2 << 30) | (4 << 16) | (229 << 8);
/// `FUSE_DEV_IOC_BACKING_OPEN` = `_IOW(229, 1, struct fuse_backing_map)` (16 bytes).
const FUSE_DEV_IOC_BACKING_OPEN: libc::c_ulong = (1 << 30) | (16 << 16) | (229 << 8) | 1;
/// `FUSE_DEV_IOC_BACKING_CLOSE` = `_IOW(229, 2, uint32_t)`.
const FUSE_DEV_IOC_BACKING_CLOSE: libc::c_ulong = (1 << 30) | (4 << 16) | (229 << 8) | 2;
/// `FUSE_NOTIFY_INVAL_INODE`.
const NOTIFY_INVAL_INODE: i32 = 2;
/// `FUSE_NOTIFY_INVAL_ENTRY`.
const NOTIFY_INVAL_ENTRY: i32 = 3;

/// `struct fuse_backing_map`.
#[repr(C)]
struct BackingMap {
    fd: i32,
    flags: u32,
    padding: u64,
}

/// A new descriptor of the connection on `dev` (`FUSE_DEV_IOC_CLONE` on a fresh `/dev/fuse`):
/// requests are handed to each descriptor's readers in turn.
///
/// # Errors
/// `/dev/fuse` cannot be opened (a user mounting through fusermount3 without access to it) or
/// the kernel refused the clone.
pub fn clone_fd(dev: BorrowedFd<'_>) -> std::io::Result<OwnedFd> {
    let new: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")?
        .into();
    let mut source = dev.as_raw_fd() as u32;
    // SAFETY: the ioctl reads one u32 from a valid pointer; `new` is an open /dev/fuse fd.
    let r = unsafe { libc::ioctl(new.as_raw_fd(), FUSE_DEV_IOC_CLONE, &mut source as *mut u32) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(new)
}

/// Register `file` as a passthrough backing on the connection `dev`; returns its backing id.
///
/// # Errors
/// The kernel refused (no passthrough granted, `CAP_SYS_ADMIN` missing, a stacked file).
pub fn backing_open(dev: BorrowedFd<'_>, file: BorrowedFd<'_>) -> std::io::Result<u32> {
    let map = BackingMap {
        fd: file.as_raw_fd(),
        flags: 0,
        padding: 0,
    };
    // SAFETY: the ioctl reads one `struct fuse_backing_map` from a valid pointer; `dev` is an
    // open /dev/fuse fd.
    let r = unsafe {
        libc::ioctl(
            dev.as_raw_fd(),
            FUSE_DEV_IOC_BACKING_OPEN,
            &map as *const BackingMap,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(r as u32)
}

/// Close passthrough backing `id` on the connection `dev`.
///
/// # Errors
/// The kernel refused (an unknown id, the connection gone).
pub fn backing_close(dev: BorrowedFd<'_>, id: u32) -> std::io::Result<()> {
    // SAFETY: the ioctl reads one u32 from a valid pointer; `dev` is an open /dev/fuse fd.
    let r = unsafe {
        libc::ioctl(
            dev.as_raw_fd(),
            FUSE_DEV_IOC_BACKING_CLOSE,
            &id as *const u32,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The `FUSE_NOTIFY_INVAL_INODE` frame for `node`: attributes only (`data` false, offset -1),
/// or attributes and every cached page (offset 0, length 0).
pub fn inval_inode(node: NodeId, data: bool) -> Vec<u8> {
    let mut body = Vec::with_capacity(24);
    body.extend_from_slice(&node.0.to_ne_bytes());
    let off: i64 = if data { 0 } else { -1 };
    body.extend_from_slice(&off.to_ne_bytes());
    body.extend_from_slice(&0i64.to_ne_bytes());
    notification(NOTIFY_INVAL_INODE, &body)
}

/// The `FUSE_NOTIFY_INVAL_ENTRY` frame for `name` in directory `parent`.
pub fn inval_entry(parent: NodeId, name: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(16 + name.len() + 1);
    body.extend_from_slice(&parent.0.to_ne_bytes());
    body.extend_from_slice(&(name.len() as u32).to_ne_bytes());
    body.extend_from_slice(&0u32.to_ne_bytes());
    body.extend_from_slice(name);
    body.push(0);
    notification(NOTIFY_INVAL_ENTRY, &body)
}

/// A notification frame: `fuse_out_header` with `unique` 0 and `code` in `error`, then `body`.
fn notification(code: i32, body: &[u8]) -> Vec<u8> {
    let mut frame = wire::out_header(0, code, body.len()).to_vec();
    frame.extend_from_slice(body);
    frame
}

/// Write a notification `frame` to `dev`.
///
/// # Errors
/// The kernel refused it: `ENOENT` when it holds nothing the notification names, `ENODEV` once
/// the mount is gone.
pub fn notify(dev: BorrowedFd<'_>, frame: &[u8]) -> std::io::Result<()> {
    nix::unistd::write(dev, frame)
        .map(|_| ())
        .map_err(std::io::Error::from)
}

/// The worker threads serving `/dev/fuse`; [`Workers::join`] waits for them to end at unmount.
#[derive(Debug)]
pub struct Workers {
    threads: Vec<JoinHandle<std::io::Result<()>>>,
}

impl Workers {
    /// Number of threads.
    pub fn len(&self) -> usize {
        self.threads.len()
    }

    /// No thread (never, once started).
    pub fn is_empty(&self) -> bool {
        self.threads.is_empty()
    }

    /// Wait for every thread to end (at unmount); the first error a thread ended with.
    ///
    /// # Errors
    /// A read from the device failed with something else than the mount ending, or a thread
    /// panicked.
    pub fn join(self) -> std::io::Result<()> {
        let mut first = Ok(());
        for t in self.threads {
            let r = t
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("a /dev/fuse thread panicked")));
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

/// Start `n` threads serving the connection on `dev` with `disp`, each reading requests of up
/// to `max_request` bytes. The first reads `dev` itself, the others a clone each ([`clone_fd`];
/// when cloning fails they share `dev`, which the kernel serves all the same, one queue).
/// `uring`: FUSE over io_uring was negotiated (only FORGET and INTERRUPT come here, and FORGETs
/// follow the queue threads' scheduling policy, docs/PROTOCOL-NOTES.md U8).
///
/// # Errors
/// A thread could not be started.
pub fn start(
    dev: &Arc<OwnedFd>,
    disp: &Arc<Dispatcher>,
    n: usize,
    max_request: usize,
    uring: bool,
) -> std::io::Result<Workers> {
    let mut threads = Vec::with_capacity(n);
    for i in 0..n.max(1) {
        let fd = if i == 0 {
            dev.clone()
        } else {
            match clone_fd(dev.as_fd()) {
                Ok(fd) => Arc::new(fd),
                Err(e) => {
                    tracing::debug!("FUSE_DEV_IOC_CLONE: {e}: the thread shares the descriptor");
                    dev.clone()
                }
            }
        };
        let disp = disp.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("smithfs-fuse-{i}"))
                .spawn(move || serve(&fd, &disp, max_request, uring))?,
        );
    }
    Ok(Workers { threads })
}

/// Serve requests from `dev` until the mount ends.
fn serve(dev: &OwnedFd, disp: &Dispatcher, max_request: usize, uring: bool) -> std::io::Result<()> {
    // The kernel refuses a read into less than max_write plus the largest header and argument.
    let mut buf = vec![0u8; max_request.max(wire::MIN_READ_BUFFER)];
    loop {
        let n = match nix::unistd::read(dev.as_raw_fd(), &mut buf) {
            Ok(n) => n,
            Err(
                nix::errno::Errno::ENOENT | nix::errno::Errno::EINTR | nix::errno::Errno::EAGAIN,
            ) => continue,
            Err(nix::errno::Errno::ENODEV) => return Ok(()),
            Err(e) => {
                tracing::error!("reading /dev/fuse: {e}");
                return Err(e.into());
            }
        };
        if !serve_one(dev.as_fd(), disp, &mut buf, n, uring) {
            return Ok(());
        }
    }
}

/// Serve the request in `buf[..n]` and write its reply; `false` once the mount is gone.
fn serve_one(
    dev: BorrowedFd<'_>,
    disp: &Dispatcher,
    buf: &mut [u8],
    n: usize,
    uring: bool,
) -> bool {
    let (h, reply) = match wire::split_dev_fuse(&buf[..n]) {
        Ok((h, arg, payload)) => {
            if h.opcode == opcode::BATCH_FORGET {
                if uring {
                    super::uring::follow_headroom();
                }
                match wire::batch_forgets(arg, payload) {
                    Ok(all) => {
                        for (node, nlookup) in all {
                            disp.fs().forget(NodeId(node), nlookup);
                        }
                    }
                    Err(e) => tracing::warn!("undecodable BATCH_FORGET: {e}"),
                }
                return true;
            }
            if uring && h.opcode == opcode::FORGET {
                // Deferrable work, which follows the queue threads' policy (U8).
                super::uring::follow_headroom();
            }
            let reply = disp.serve_framed(&h, arg, payload);
            (h, reply)
        }
        Err(err) => {
            tracing::warn!("undecodable FUSE request header: {err}");
            return true;
        }
    };
    let written = match &reply {
        Reply::None => return true,
        // Data goes out as it is, beside its header: no copy into the buffer.
        Reply::Data(d) | Reply::Listing(d, _) => {
            let head = wire::out_header(h.unique, 0, d.len());
            nix::sys::uio::writev(dev, &[IoSlice::new(&head), IoSlice::new(d)])
        }
        _ => {
            let mut out = Out::new(buf);
            let error = reply.encode(&mut out);
            let len = out.len();
            let head = wire::out_header(h.unique, error, len);
            nix::sys::uio::writev(dev, &[IoSlice::new(&head), IoSlice::new(&buf[..len])])
        }
    };
    match written {
        Ok(_) => true,
        // The caller was interrupted and gave up on the reply.
        Err(nix::errno::Errno::ENOENT) => true,
        Err(nix::errno::Errno::ENODEV) => false,
        Err(e) => {
            tracing::debug!(opcode = h.opcode, "writing a FUSE reply: {e}");
            true
        }
    }
}
