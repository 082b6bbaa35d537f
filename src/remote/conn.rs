//! One remote connection's requests (docs/SPEC.md §13, docs/PROTOCOL-NOTES.md R5–R8): framing
//! and the connection's own tables around the shared [`Dispatcher`], with no socket in sight
//! (so every rule here is tested without a kernel or a network).
//!
//! A frame is a FUSE request exactly as the node's kernel wrote it to `/dev/fuse`
//! (`fuse_in_header.len` is the frame's length); the answer is the reply as the daemon would
//! write it to `/dev/fuse`. The connection keeps:
//! - the node ids it was given and how many lookups of each (a reply with an entry, CREATE,
//!   each READDIRPLUS entry); a request about a node id it does not hold (the root excepted)
//!   is `ESTALE`, a FORGET never gives back more than it holds;
//! - the file and directory handles it opened, each with the node it was opened on (handle
//!   numbers are unique per kind of node only: a control file's handle may have the number of a
//!   file's, so the pair is the handle, notes R55); a handle it does not hold (another
//!   connection's, or closed) is `EBADF`.
//!
//! When the connection drops, [`Connection::drop_all`] closes its handles without completing
//! anything (R6) and gives back every lookup it held.
//!
//! Requests of one connection may be served concurrently ([`Connection::serve`] takes `&self`;
//! docs/PROTOCOL-NOTES.md R41): the tables are under a lock held only to check a request and to
//! record its reply, never while the filesystem works. A reply's node ids and handles are
//! recorded before the reply is returned, so the node can name them only afterwards; a handle
//! released while another request of the same connection still uses it makes that request
//! EBADF in the filesystem (handle numbers are never reused), a node forgotten meanwhile
//! ESTALE. [`Connection::drop_all`] must run once no request is being served.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::fs::FsError;
use crate::fs::{NodeId, SmithFs};
use crate::fuse::dispatch::{Dispatcher, Reply};
use crate::fuse::wire::{self, opcode, InHeader, Out, Request, IN_HEADER_LEN};

/// Largest write a node may forward in one request (bytes): the `max_write` the node offers
/// its kernel at INIT.
pub const MAX_WRITE: u32 = 1 << 20;
/// Largest frame accepted (bytes): a WRITE of [`MAX_WRITE`] with its header and argument, or a
/// request with two names of `PATH_MAX`. A longer `len` closes the connection.
pub const MAX_FRAME: usize = MAX_WRITE as usize + 4096 + 2 * 4096;
/// Largest READ, READDIR or xattr reply a request may ask for (bytes); a larger `size` is
/// clamped to it (the node's kernel never asks for more than its `max_pages`).
pub const MAX_REPLY: u32 = MAX_WRITE;

/// Why a connection is closed: a frame no kernel would send.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    /// `len` below the header or above [`MAX_FRAME`], or not the frame's length.
    #[error("frame length {0} out of bounds")]
    Length(usize),
    /// The request's arguments do not decode.
    #[error("undecodable request (opcode {0}): {1}")]
    Undecodable(u32, wire::WireError),
}

/// What a request changed, for the other kernels' caches: the one computation every framing
/// shares, in [`crate::fuse::dispatch`].
pub use crate::fuse::dispatch::Change;

/// A remote connection's requests and tables.
#[derive(Debug)]
pub struct Connection {
    dispatcher: Dispatcher,
    tables: Arc<Mutex<Tables>>,
}

/// Which node ids a connection holds, as the listener sees it when it decides whom to tell of
/// a change (docs/PROTOCOL-NOTES.md R62); once the connection dropped its tables it holds
/// nothing but the root.
#[derive(Debug, Clone)]
pub struct Held(Arc<Mutex<Tables>>);

impl Held {
    /// Whether the connection holds node id `n` now (the root always).
    pub fn node(&self, n: NodeId) -> bool {
        self.0.lock().holds_node(n.0)
    }
}

/// What a connection holds.
#[derive(Debug, Default)]
struct Tables {
    /// Node id → lookups this connection holds.
    nodes: HashMap<u64, u64>,
    /// File handles with the node each was opened on.
    files: HashSet<(u64, u64)>,
    /// Directory handles with the node each was opened on.
    dirs: HashSet<(u64, u64)>,
}

impl Tables {
    fn holds_node(&self, n: u64) -> bool {
        n == NodeId::ROOT.0 || self.nodes.contains_key(&n)
    }

    fn take_lookup(&mut self, n: NodeId) {
        if n.0 != 0 {
            *self.nodes.entry(n.0).or_insert(0) += 1;
        }
    }

    /// Take back up to `n` of the lookups of `node` held: how many were.
    fn give_back(&mut self, node: NodeId, n: u64) -> u64 {
        let Some(held) = self.nodes.get_mut(&node.0) else {
            return 0;
        };
        let n = n.min(*held);
        *held -= n;
        if *held == 0 {
            self.nodes.remove(&node.0);
        }
        n
    }
}

/// The length a frame starting with `head` declares (its first 4 bytes), checked against
/// [`IN_HEADER_LEN`] and [`MAX_FRAME`]; `Ok(None)` until 4 bytes are there.
///
/// # Errors
/// [`Malformed::Length`].
pub fn frame_len(head: &[u8]) -> Result<Option<usize>, Malformed> {
    let Some(b) = head.get(..4) else {
        return Ok(None);
    };
    let len = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize;
    if !(IN_HEADER_LEN..=MAX_FRAME).contains(&len) {
        return Err(Malformed::Length(len));
    }
    Ok(Some(len))
}

impl Connection {
    /// A connection whose requests `dispatcher` serves (made with [`Dispatcher::vouched`]).
    pub fn new(dispatcher: Dispatcher) -> Connection {
        Connection {
            dispatcher,
            tables: Arc::new(Mutex::new(Tables::default())),
        }
    }

    /// The filesystem it serves.
    pub fn fs(&self) -> &SmithFs {
        self.dispatcher.fs()
    }

    /// (node ids, file handles, directory handles) held now.
    pub fn held(&self) -> (usize, usize, usize) {
        let t = self.tables.lock();
        (t.nodes.len(), t.files.len(), t.dirs.len())
    }

    /// A handle to ask, from another thread, which node ids this connection holds.
    pub fn holder(&self) -> Held {
        Held(self.tables.clone())
    }

    /// Serve one whole frame (from any thread: see the module's notes on concurrency): the
    /// reply frame (`fuse_out_header` and body), `None` for FORGET and INTERRUPT. What the
    /// request changed is told by the dispatcher ([`Dispatcher::with_changes`]).
    ///
    /// # Errors
    /// [`Malformed`]: the connection must be closed.
    pub fn serve(&self, frame: &[u8]) -> Result<Option<Vec<u8>>, Malformed> {
        if frame_len(frame)? != Some(frame.len()) {
            return Err(Malformed::Length(frame.len()));
        }
        let (h, arg, payload) =
            wire::split_dev_fuse(frame).map_err(|e| Malformed::Undecodable(0, e))?;
        if h.opcode == opcode::BATCH_FORGET {
            self.batch_forget(arg, payload)
                .map_err(|e| Malformed::Undecodable(h.opcode, e))?;
            return Ok(None);
        }
        let req = Request::decode(h.opcode, arg, payload)
            .map_err(|e| Malformed::Undecodable(h.opcode, e))?;
        let reply = match self.refuse(&h, &req) {
            Some(e) => Reply::Error(e.raw()),
            None => self.forward(&h, req),
        };
        if matches!(reply, Reply::None) {
            return Ok(None);
        }
        let mut body = vec![0u8; reply_room(&reply)];
        let mut out = Out::new(&mut body);
        let error = reply.encode(&mut out);
        let n = out.len();
        let mut frame = wire::out_header(h.unique, error, n).to_vec();
        frame.extend_from_slice(&body[..n]);
        Ok(Some(frame))
    }

    /// The error for a request that names what this connection does not hold, if it does.
    fn refuse(&self, h: &InHeader, req: &Request<'_>) -> Option<FsError> {
        let t = self.tables.lock();
        if matches!(
            req,
            Request::Other(_)
                | Request::Destroy
                | Request::Interrupt { .. }
                | Request::Forget { .. }
        ) {
            return None;
        }
        let mut nodes = vec![h.nodeid];
        match req {
            Request::Rename { newdir, .. } => nodes.push(*newdir),
            Request::Link { oldnodeid, .. } => nodes.push(*oldnodeid),
            Request::CopyFileRange { nodeid_out, .. } => nodes.push(*nodeid_out),
            _ => {}
        }
        if !nodes.iter().all(|&n| t.holds_node(n)) {
            return Some(FsError::NodeNotHeld);
        }
        let file = |fh: u64, node: u64| t.files.contains(&(fh, node));
        let dir = |fh: u64| t.dirs.contains(&(fh, h.nodeid));
        let ok = match *req {
            Request::Getattr { fh: Some(fh) } => file(fh, h.nodeid),
            Request::Setattr(s) if s.valid & wire::fattr::FH != 0 => file(s.fh, h.nodeid),
            Request::Read { fh, .. }
            | Request::Write { fh, .. }
            | Request::Release { fh, .. }
            | Request::Fsync { fh, .. }
            | Request::Flush { fh }
            | Request::Fallocate { fh, .. }
            | Request::Lseek { fh, .. } => file(fh, h.nodeid),
            Request::CopyFileRange {
                fh_in,
                nodeid_out,
                fh_out,
                ..
            } => file(fh_in, h.nodeid) && file(fh_out, nodeid_out),
            Request::Readdir { fh, .. }
            | Request::Readdirplus { fh, .. }
            | Request::Releasedir { fh }
            | Request::Fsyncdir { fh, .. } => dir(fh),
            _ => true,
        };
        (!ok).then_some(FsError::HandleNotHeld)
    }

    /// Dispatch an admitted request and keep the tables in step with its reply.
    fn forward(&self, h: &InHeader, req: Request<'_>) -> Reply {
        let node = NodeId(h.nodeid);
        let req = clamp(req);
        match req {
            Request::Forget { nlookup } => {
                self.forget(node, nlookup);
                return Reply::None;
            }
            // Every request runs to its end (notes R41): the node's kernel takes the reply.
            Request::Interrupt { .. } => return Reply::None,
            _ => {}
        }
        let closing = match req {
            Request::Release { fh, .. } => Some((fh, false)),
            Request::Releasedir { fh } => Some((fh, true)),
            _ => None,
        };
        let is_opendir = matches!(req, Request::Opendir { .. });
        let reply = self.dispatcher.dispatch(h, req);
        let mut t = self.tables.lock();
        match (&reply, closing) {
            // A handle is gone once the kernel released it, whatever the answer.
            (_, Some((fh, false))) => {
                t.files.remove(&(fh, h.nodeid));
            }
            (_, Some((fh, true))) => {
                t.dirs.remove(&(fh, h.nodeid));
            }
            (Reply::Entry(e), None) => t.take_lookup(NodeId(e.nodeid)),
            (Reply::Create(e, fh, ..), None) => {
                t.take_lookup(NodeId(e.nodeid));
                t.files.insert((*fh, e.nodeid));
            }
            (Reply::Open(fh, ..), None) if is_opendir => {
                t.dirs.insert((*fh, h.nodeid));
            }
            (Reply::Open(fh, ..), None) => {
                t.files.insert((*fh, h.nodeid));
            }
            (Reply::Listing(_, looked_up), None) => {
                for &n in looked_up {
                    t.take_lookup(n);
                }
            }
            _ => {}
        }
        reply
    }

    /// Give back up to `n` of this connection's lookups of `node`.
    fn forget(&self, node: NodeId, n: u64) {
        let n = self.tables.lock().give_back(node, n);
        if n > 0 {
            self.dispatcher.fs().forget(node, n);
        }
    }

    /// `fuse_batch_forget_in` (count, padding) and `count` × `fuse_forget_one` (node id,
    /// lookups), as single FORGETs.
    fn batch_forget(&self, arg: &[u8], payload: &[u8]) -> Result<(), wire::WireError> {
        // BATCH_FORGET's fixed argument is 8 bytes; the entries follow in the payload.
        let count = arg
            .get(..4)
            .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or(wire::WireError::Short)? as usize;
        if payload.len() < count.saturating_mul(16) {
            return Err(wire::WireError::Short);
        }
        for one in payload.chunks_exact(16).take(count) {
            let mut a = [0u8; 8];
            a.copy_from_slice(&one[..8]);
            let node = u64::from_ne_bytes(a);
            a.copy_from_slice(&one[8..]);
            self.forget(NodeId(node), u64::from_ne_bytes(a));
        }
        Ok(())
    }

    /// The connection dropped: close every handle it held without completing anything
    /// (docs/PROTOCOL-NOTES.md R6) and give back every lookup.
    pub fn drop_all(&mut self) {
        let fs = self.dispatcher.fs().clone();
        let t = std::mem::take(&mut *self.tables.lock());
        for (fh, node) in t.files {
            let _ = fs.abandon(NodeId(node), crate::fs::Fh(fh));
        }
        for (fh, node) in t.dirs {
            let _ = fs.releasedir(NodeId(node), crate::fs::Fh(fh));
        }
        for (node, n) in t.nodes {
            fs.forget(NodeId(node), n);
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.drop_all();
    }
}

/// Bound the reply sizes a request may ask for ([`MAX_REPLY`]): a node cannot make the daemon
/// allocate more than that for one reply.
fn clamp(req: Request<'_>) -> Request<'_> {
    let c = |s: u32| s.min(MAX_REPLY);
    match req {
        Request::Read { fh, offset, size } => Request::Read {
            fh,
            offset,
            size: c(size),
        },
        Request::Readdir { fh, offset, size } => Request::Readdir {
            fh,
            offset,
            size: c(size),
        },
        Request::Readdirplus { fh, offset, size } => Request::Readdirplus {
            fh,
            offset,
            size: c(size),
        },
        Request::Getxattr { size, name } => Request::Getxattr {
            size: c(size),
            name,
        },
        Request::Listxattr { size } => Request::Listxattr { size: c(size) },
        other => other,
    }
}

/// Room for `reply`'s body.
fn reply_room(reply: &Reply) -> usize {
    match reply {
        Reply::Data(d) | Reply::Listing(d, _) => d.len(),
        _ => 256,
    }
}
