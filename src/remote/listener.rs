//! The daemon's listener (`launcher.listen`, docs/SPEC.md §13): accepts TLS connections, takes
//! each one's hello, and serves an accepted connection's frames on a thread of its own
//! ([`conn::Connection`]), pushing every other kernel's changes down to it as FUSE
//! notifications.
//!
//! Bounds (docs/PROTOCOL-NOTES.md R7): at most [`MAX_CONNECTIONS`] connections that proved a run
//! (more are refused after their hello) and [`MAX_UNPROVEN`] still proving one (a new one closes
//! one of the address holding the most, the least far along first, R50); a connection that has not completed its hello within
//! [`HELLO_TIMEOUT`] is closed; at most [`MAX_WORKERS`] requests of a connection are served at
//! once (R41) and a thread takes its next request only once its reply is sent, so a node that
//! floods fills its own socket buffers; a connection whose pending notifications exceed
//! [`MAX_PENDING`] is closed (its kernel's cache could no longer be trusted: its mount fails
//! closed).

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout};
use parking_lot::{Condvar, Mutex};

use super::busy_poll::BusyPoller;
use super::channel::Channel;
use super::conn::{self, Change, Connection, MAX_FRAME, MAX_WRITE};
use super::keys::{Grant, RunKeys, RunSlot, Ticket, MAX_RUN_ID, PIN_LEN, SECRET_LEN};
use super::oob;
use super::{tls, Status, HELLO_HEAD, MAGIC, VERSION};
use crate::fs::{Caller, SmithFs};
use crate::fuse::dispatch::{Changes, Dispatcher, Origin};
use crate::tree::model::SmithIdx;

/// Most connections served at once.
pub const MAX_CONNECTIONS: usize = 256;
/// Most connections at once that have not yet proved a run (TLS handshake and hello under way):
/// a new one beyond them closes one of them — of the source address holding the most, the one
/// least far along (silent before TLS-talking before handshaken), oldest first — so connections
/// without a ticket cost the daemon a bounded number of threads, a flood from one address
/// evicts its own connections first, and an `attach` that was closed retries (notes R50).
pub const MAX_UNPROVEN: usize = 32;
/// Time a connection has for its TLS handshake and its hello.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// Most notifications waiting for one connection.
pub const MAX_PENDING: usize = 4096;

/// How the listener is set up.
#[derive(Debug, Clone)]
pub struct ListenerOptions {
    /// `host:port` to listen on (`launcher.listen`; port 0: any free port).
    pub listen: String,
    /// `host:port` the tickets name (`launcher.advertise`); `None`: the address listened on.
    pub advertise: Option<String>,
    /// The daemon's mount point: the node mounts at the same path.
    pub mount_point: PathBuf,
    /// The uid and gid a remote run's requests carry (what a local run of the same smith would
    /// have: the agents' user under the sandbox, the daemon's otherwise).
    pub run_uid: u32,
    /// See `run_uid`.
    pub run_gid: u32,
}

/// One served connection, as the others see it.
struct Peer {
    id: u64,
    /// Notification frames waiting to be sent.
    queue: Mutex<VecDeque<Vec<u8>>>,
    /// Too many were waiting: the connection is being closed.
    overflowed: AtomicBool,
    /// Written to (one byte) when something was queued.
    wake: UnixStream,
    /// The connection's socket, to cut it.
    sock: TcpStream,
    /// The node ids the connection holds: a name in a directory it does not hold is never
    /// pushed to it (docs/PROTOCOL-NOTES.md R62).
    held: conn::Held,
}

/// Every served connection: where changes are pushed. As a [`Changes`] sink it tells every
/// connection but the one a request came from (a listener's own sink when no daemon gives it
/// one, [`Listener::start`]).
#[derive(Default)]
pub struct Peers {
    list: Mutex<Vec<Arc<Peer>>>,
    /// `list`'s length, stored under its lock and read without it: a request through the
    /// daemon's own mount looks here, not at the lock, to learn whether anyone is to be told.
    count: AtomicUsize,
}

impl std::fmt::Debug for Peers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peers")
            .field("connections", &self.len())
            .finish()
    }
}

impl Peers {
    /// Tell every connection but `except` that `change` happened.
    ///
    /// Ordering: a connection is counted (`SeqCst`, after it is in the list) before its first
    /// request is read, and a change is broadcast after the request that made it was served,
    /// so a count of 0 read here (`SeqCst`) means the connection was counted after the change
    /// was made: every request it serves sees the change, and nothing it cached needs telling.
    pub fn broadcast(&self, except: Option<u64>, change: &Change) {
        if self.count.load(Ordering::SeqCst) == 0 {
            return;
        }
        let list = self.list.lock();
        if list.iter().all(|p| Some(p.id) == except) {
            return;
        }
        // A name is told only to connections that hold its directory (R62): one that does not
        // has nothing of it cached, and must not learn names it may not list.
        let told = |p: &Peer| match change {
            Change::Entry { parent, .. } => p.held.node(*parent),
            Change::Node { .. } => true,
        };
        let frame = super::notification(change);
        for p in list.iter().filter(|p| Some(p.id) != except && told(p)) {
            let mut q = p.queue.lock();
            // The same change twice in a row (a writer's successive writes) is told once.
            if q.back() == Some(&frame) {
                drop(q);
                continue;
            }
            if q.len() >= MAX_PENDING {
                p.overflowed.store(true, Ordering::Relaxed);
            } else {
                q.push_back(frame.clone());
            }
            drop(q);
            let _ = (&p.wake).write(&[1]);
        }
    }

    /// Connections served now (no lock taken).
    pub fn len(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// No connection is served.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Serve `peer`: counted before the caller reads its first request.
    fn add(&self, peer: Arc<Peer>) {
        let mut list = self.list.lock();
        list.push(peer);
        self.count.store(list.len(), Ordering::SeqCst);
    }

    fn remove(&self, id: u64) {
        let mut list = self.list.lock();
        list.retain(|p| p.id != id);
        self.count.store(list.len(), Ordering::SeqCst);
    }

    fn cut_all(&self) {
        for p in self.list.lock().iter() {
            let _ = p.sock.shutdown(std::net::Shutdown::Both);
        }
    }
}

impl Changes for Peers {
    fn listening(&self, _from: Origin) -> bool {
        true
    }

    fn changed(&self, from: Origin, change: &Change) {
        let except = match from {
            Origin::Local => None,
            Origin::Remote(id) => Some(id),
        };
        self.broadcast(except, change);
    }
}

/// A connection still in its handshake or hello.
struct Unproven {
    id: u64,
    /// Its peer's address (`None`: unknown), whose connections are counted together.
    source: Option<std::net::IpAddr>,
    /// How far it got ([`Stage`] as a number), set by its serving thread.
    stage: Arc<std::sync::atomic::AtomicU8>,
    /// A handle to cut it.
    sock: TcpStream,
}

/// How far an unproven connection got: the lower, the sooner it is closed to make room.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
enum Stage {
    /// Accepted, nothing received yet.
    Silent = 0,
    /// Bytes arrived (its TLS handshake is under way).
    Talking = 1,
    /// Its TLS handshake is done; its hello is awaited.
    Handshaken = 2,
}

struct Shared {
    fs: Arc<SmithFs>,
    tls: Arc<rustls::ServerConfig>,
    keys: Arc<RunKeys>,
    peers: Arc<Peers>,
    opts: ListenerOptions,
    /// Where what a connection's requests changed is told (with the connection's [`Origin`]).
    changes: Arc<dyn Changes>,
    /// Connections that proved a run, being served.
    live: AtomicUsize,
    /// Connections still in their handshake or hello, oldest first.
    unproven: Mutex<VecDeque<Unproven>>,
    /// Unproven connections closed to make room, since last logged.
    evicted: Mutex<Throttle>,
    /// Connections that ended before proving a run (no ticket needed to make one), since last
    /// logged (docs/PROTOCOL-NOTES.md H25).
    unproven_ended: Mutex<Throttle>,
    next_id: AtomicU64,
    stop: AtomicBool,
}

impl Shared {
    /// Admit a new connection among the unproven ones, closing one of them when they are
    /// [`MAX_UNPROVEN`] already ([`Shared::victim`]; logged at most every 10 s, with the count).
    /// Returns its id and where its serving thread records its [`Stage`].
    fn admit(&self, sock: &TcpStream) -> Option<(u64, Arc<std::sync::atomic::AtomicU8>)> {
        let cut = sock.try_clone().ok()?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let stage = Arc::new(std::sync::atomic::AtomicU8::new(Stage::Silent as u8));
        let source = sock.peer_addr().ok().map(|a| a.ip());
        let mut q = self.unproven.lock();
        if q.len() >= MAX_UNPROVEN {
            if let Some(victim) = Self::victim(&q, source).and_then(|i| q.remove(i)) {
                let _ = victim.sock.shutdown(std::net::Shutdown::Both);
                if let Some(closed) = self.evicted.lock().note() {
                    tracing::warn!(
                        closed,
                        "remote mount: more than {MAX_UNPROVEN} connections without a hello; the oldest closed"
                    );
                }
            }
        }
        q.push_back(Unproven {
            id,
            source,
            stage: stage.clone(),
            sock: cut,
        });
        Some((id, stage))
    }

    /// Which of the unproven connections `q` (oldest first) a new one from `newcomer` closes:
    /// of the source address holding the most of them (the newcomer's own counted as one more,
    /// so a flooding address loses first, and ties go to the newcomer's), the least far along
    /// ([`Stage`]), the oldest of those.
    fn victim(q: &VecDeque<Unproven>, newcomer: Option<std::net::IpAddr>) -> Option<usize> {
        let mut held: std::collections::HashMap<Option<std::net::IpAddr>, usize> =
            std::collections::HashMap::new();
        for u in q {
            *held.entry(u.source).or_default() += 1;
        }
        *held.entry(newcomer).or_default() += 1;
        let most = held.values().copied().max()?;
        let source = if held.get(&newcomer) == Some(&most) {
            newcomer
        } else {
            held.iter().find(|(_, &n)| n == most).map(|(s, _)| *s)?
        };
        q.iter()
            .enumerate()
            .filter(|(_, u)| u.source == source)
            .min_by_key(|(i, u)| (u.stage.load(Ordering::Relaxed), *i))
            .map(|(i, _)| i)
            .or_else(|| (!q.is_empty()).then_some(0))
    }

    /// Connection `id` has sent its whole hello (or failed): it is no longer unproven. Returns
    /// false when it was closed to make room meanwhile: its hello is then not taken, so the
    /// run's secret is never spent by a connection the daemon cut (its `attach` retries).
    fn proven(&self, id: u64) -> bool {
        let mut q = self.unproven.lock();
        let before = q.len();
        q.retain(|u| u.id != id);
        q.len() != before
    }
}

/// The listener: accepting on a thread of its own until dropped.
pub struct Listener {
    shared: Arc<Shared>,
    addr: SocketAddr,
    pin: [u8; PIN_LEN],
    accept: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Listener {
    /// Listen on `opts.listen` with the certificate `identity`, serving `fs`; what a
    /// connection's requests change is told to `changes`, which must tell this listener's other
    /// connections ([`Listener::peers`]) and may tell more (the daemon's `Kernels`: its own
    /// mount too); `None`: to the other connections only.
    ///
    /// # Errors
    /// One sentence: the address does not bind, or TLS refused the certificate.
    pub fn start(
        fs: Arc<SmithFs>,
        opts: ListenerOptions,
        identity: &tls::Identity,
        changes: Option<Arc<dyn Changes>>,
    ) -> Result<Listener, String> {
        let sock = TcpListener::bind(&opts.listen)
            .map_err(|e| format!("launcher.listen {}: cannot listen: {e}", opts.listen))?;
        let addr = sock.local_addr().map_err(|e| e.to_string())?;
        let peers = Arc::new(Peers::default());
        let shared = Arc::new(Shared {
            fs,
            tls: identity.server_config()?,
            keys: Arc::new(RunKeys::default()),
            changes: changes.unwrap_or_else(|| peers.clone()),
            peers,
            opts,
            live: AtomicUsize::new(0),
            unproven: Mutex::new(VecDeque::new()),
            evicted: Mutex::new(Throttle::default()),
            unproven_ended: Mutex::new(Throttle::default()),
            next_id: AtomicU64::new(1),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let accept = std::thread::Builder::new()
            .name("smithfs-listen".into())
            .spawn(move || accept_loop(&s, &sock))
            .map_err(|e| format!("cannot start the listener's thread: {e}"))?;
        tracing::info!(%addr, "remote mount listener started");
        Ok(Listener {
            shared,
            addr,
            pin: identity.pin(),
            accept: Some(accept),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The runs' secrets.
    pub fn keys(&self) -> &Arc<RunKeys> {
        &self.shared.keys
    }

    /// The served connections (where the daemon's own changes are pushed too).
    pub fn peers(&self) -> &Arc<Peers> {
        &self.shared.peers
    }

    /// Mint the secret of run `run_id` of `smith` and make its ticket; what the run's node
    /// outputs goes to `output` (the write end of its output pipe; `None`: discarded).
    ///
    /// # Errors
    /// The random source failed.
    pub fn ticket(&self, run_id: &str, smith: SmithIdx) -> Result<Ticket, String> {
        self.ticket_with(run_id, smith, Grant::default(), None)
    }

    /// Mint the secret of run `run_id` of `smith` with `grant` (the ids its requests are judged
    /// with, the sandbox its `attach` starts COMMAND in) and make its ticket; what the run's
    /// node outputs goes to `output` (the write end of its output pipe; `None`: discarded;
    /// docs/PROTOCOL-NOTES.md R16).
    ///
    /// # Errors
    /// The random source failed, or the sandbox plan is longer than a welcome carries.
    pub fn ticket_with(
        &self,
        run_id: &str,
        smith: SmithIdx,
        grant: Grant,
        output: Option<std::os::fd::OwnedFd>,
    ) -> Result<Ticket, String> {
        if grant
            .sandbox
            .as_ref()
            .is_some_and(|p| p.len() >= super::MAX_SANDBOX)
        {
            return Err(format!(
                "the run's sandbox plan is longer than {} bytes (sandbox.readable, sandbox.writable?)",
                super::MAX_SANDBOX - 1
            ));
        }
        let secret = self.shared.keys.mint_with(run_id, smith, grant, output)?;
        Ok(Ticket {
            addr: self
                .shared
                .opts
                .advertise
                .clone()
                .unwrap_or_else(|| self.addr.to_string()),
            run_id: run_id.to_string(),
            secret,
            pin: self.pin,
        })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        self.shared.peers.cut_all();
    }
}

fn accept_loop(shared: &Arc<Shared>, sock: &TcpListener) {
    for stream in sock.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = stream else { continue };
        let Some((id, stage)) = shared.admit(&stream) else {
            continue;
        };
        let s = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("smithfs-remote".into())
            .spawn(move || {
                let peer = stream.peer_addr().ok();
                match serve(&s, stream, id, &stage) {
                    Ok(()) => {}
                    Err(Closed::Proven(e)) => {
                        tracing::info!(?peer, "remote connection closed: {e}")
                    }
                    // Anyone who reaches the port makes these, at will: one line per interval.
                    Err(Closed::Unproven(e)) => {
                        tracing::debug!(
                            ?peer,
                            "remote connection closed before proving a run: {e}"
                        );
                        if let Some(closed) = s.unproven_ended.lock().note() {
                            tracing::info!(
                                closed,
                                last = ?peer,
                                "remote mount: connections closed before proving a run (last: {e})"
                            );
                        }
                    }
                }
                s.proven(id);
            });
        if spawned.is_err() {
            shared.proven(id);
        }
    }
}

/// Serve one connection to its end, recording in `stage` how far it got before its hello; the
/// error says why it ended early.
fn serve(
    shared: &Arc<Shared>,
    sock: TcpStream,
    id: u64,
    stage: &std::sync::atomic::AtomicU8,
) -> Result<(), Closed> {
    let (ch, cut, smith, grant, slot) = prove(shared, sock, id, stage).map_err(Closed::Unproven)?;
    let r = serve_proven(shared, ch, cut, smith, &grant, &slot);
    shared.live.fetch_sub(1, Ordering::SeqCst);
    r.map_err(Closed::Proven)
}

/// Why a connection ended early.
#[derive(Debug)]
enum Closed {
    /// Before it proved a run (its handshake, hello, or a refused ticket): anyone can make these.
    Unproven(String),
    /// While it served a run.
    Proven(String),
}

/// A run's connection, proved: the channel, a handle to cut its socket, the smith, what its
/// ticket grants, the run's slot.
type Proved = (Channel, TcpStream, SmithIdx, Grant, Arc<RunSlot>);

/// Take a connection through its handshake and hello to a run it proves (counted in `live`),
/// recording in `stage` how far it got; the error says why it ended first.
fn prove(
    shared: &Arc<Shared>,
    sock: TcpStream,
    id: u64,
    stage: &std::sync::atomic::AtomicU8,
) -> Result<Proved, String> {
    let cut = sock.try_clone().map_err(|e| e.to_string())?;
    let started = std::time::Instant::now();
    // Silent until its first bytes: the first to be closed to make room (R50).
    wait_socket(&sock, true, false, None, Some(HELLO_TIMEOUT), None)?;
    stage.store(Stage::Talking as u8, Ordering::Relaxed);
    let tls = rustls::ServerConnection::new(shared.tls.clone()).map_err(|e| e.to_string())?;
    let mut ch = Channel::new(sock, tls.into()).map_err(|e| e.to_string())?;
    ch.handshake(HELLO_TIMEOUT.saturating_sub(started.elapsed()))
        .map_err(|e| format!("TLS handshake: {e}"))?;
    stage.store(Stage::Handshaken as u8, Ordering::Relaxed);
    let hello = take_hello(&mut ch);
    if !shared.proven(id) {
        return Err("closed to make room before its hello was taken".into());
    }
    let (smith, grant, slot) = match hello {
        Ok((run_id, secret)) => match shared.keys.claim(
            &run_id,
            &secret,
            cut.try_clone().map_err(|e| e.to_string())?,
        ) {
            Ok(claimed) => {
                tracing::info!(run_id, "remote connection accepted");
                claimed
            }
            Err(why) => {
                let _ = ch.send(&super::welcome(Status::Refused, 0, "refused", &[]));
                ch.close();
                return Err(format!("run {run_id:?} refused: {why}"));
            }
        },
        Err(e) => {
            let _ = ch.send(&super::welcome(Status::NotHello, 0, "not a hello", &[]));
            ch.close();
            return Err(e);
        }
    };
    // Only connections that proved a run count here (and only they are ever served).
    if shared.live.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
        shared.live.fetch_sub(1, Ordering::SeqCst);
        let _ = ch.send(&super::welcome(
            Status::Refused,
            0,
            "too many connections",
            &[],
        ));
        ch.close();
        slot.mark_ended();
        return Err(format!("more than {MAX_CONNECTIONS} runs connected"));
    }
    Ok((ch, cut, smith, grant, slot))
}

/// Serve a connection that proved run `slot` of `smith` to its end.
fn serve_proven(
    shared: &Arc<Shared>,
    mut ch: Channel,
    cut: TcpStream,
    smith: SmithIdx,
    grant: &Grant,
    slot: &RunSlot,
) -> Result<(), String> {
    let mount = shared.opts.mount_point.to_string_lossy().into_owned();
    let sandbox = grant.sandbox.as_deref().unwrap_or_default().as_bytes();
    ch.send(&super::welcome(
        Status::Accepted,
        MAX_WRITE,
        &mount,
        sandbox,
    ))
    .map_err(|e| e.to_string())?;
    let (uid, gid) = grant
        .ids
        .unwrap_or((shared.opts.run_uid, shared.opts.run_gid));
    let caller = Caller {
        pid: 0,
        uid,
        gid,
        as_smith: Some(smith),
    };
    let (wake_rx, wake_tx) = UnixStream::pair().map_err(|e| e.to_string())?;
    wake_rx.set_nonblocking(true).map_err(|e| e.to_string())?;
    wake_tx.set_nonblocking(true).map_err(|e| e.to_string())?;
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let conn = Connection::new(
        Dispatcher::vouched(shared.fs.clone(), caller)
            .with_changes(shared.changes.clone(), Origin::Remote(id)),
    );
    let peer = Arc::new(Peer {
        id,
        queue: Mutex::new(VecDeque::new()),
        overflowed: AtomicBool::new(false),
        wake: wake_tx,
        sock: cut,
        held: conn.holder(),
    });
    shared.peers.add(peer.clone());
    let r = pump(&peer, &mut ch, &conn, &wake_rx, slot);
    shared.peers.remove(peer.id);
    ch.close();
    slot.mark_ended();
    r
}

/// Read the hello: the run id and the secret.
fn take_hello(ch: &mut Channel) -> Result<(String, Vec<u8>), String> {
    let head = ch
        .read_exact(HELLO_HEAD, HELLO_TIMEOUT)
        .map_err(|e| format!("hello: {e}"))?;
    let version = u16::from_ne_bytes([head[4], head[5]]);
    let n = u16::from_ne_bytes([head[6], head[7]]) as usize;
    if &head[..4] != MAGIC || version != VERSION || n == 0 || n > MAX_RUN_ID {
        return Err("not a hello of this version".into());
    }
    let rest = ch
        .read_exact(n + SECRET_LEN, HELLO_TIMEOUT)
        .map_err(|e| format!("hello: {e}"))?;
    let run_id = String::from_utf8(rest[..n].to_vec()).map_err(|_| "run id not UTF-8")?;
    Ok((run_id, rest[n..].to_vec()))
}

/// Serve frames and push notifications until the connection ends, with a pool of up to
/// [`MAX_WORKERS`] threads (docs/PROTOCOL-NOTES.md R41): one at a time leads (reads the next
/// frame), hands the lead on and serves the frame itself, so a request is never handed from
/// thread to thread and one slow request does not hold up the others. Returns once every thread
/// of the pool has ended.
fn pump(
    peer: &Peer,
    ch: &mut Channel,
    conn: &Connection,
    wake: &UnixStream,
    slot: &RunSlot,
) -> Result<(), String> {
    let sock = ch.socket().try_clone().map_err(|e| e.to_string())?;
    let pool = Pool {
        peer,
        conn,
        slot,
        wake,
        sock,
        ch: Mutex::new(ch),
        state: Mutex::new(PoolState {
            leading: false,
            idle: 0,
            threads: 1,
            serving: 0,
            ended: None,
        }),
        turn: Condvar::new(),
        poller: BusyPoller::new(),
    };
    std::thread::scope(|s| pool.work(s));
    pool.state.into_inner().ended.unwrap_or(Ok(()))
}

/// Most requests of one connection served at once (the threads of its pool).
pub const MAX_WORKERS: usize = 4;

/// One connection's serving threads and what they share.
struct Pool<'a> {
    peer: &'a Peer,
    conn: &'a Connection,
    slot: &'a RunSlot,
    /// Readable when notifications were queued for this connection, or when the pool ends.
    wake: &'a UnixStream,
    /// The connection's socket, to wait on without holding the channel.
    sock: TcpStream,
    /// The channel: the leader reads under it, every thread writes its reply under it.
    ch: Mutex<&'a mut Channel>,
    state: Mutex<PoolState>,
    /// Signalled when the lead is free or the pool ends.
    turn: Condvar,
    /// The leader's waits for the next frame (R60).
    poller: BusyPoller,
}

struct PoolState {
    /// A thread leads (reads the next frame).
    leading: bool,
    /// Threads waiting for the lead.
    idle: usize,
    /// Threads in the pool.
    threads: usize,
    /// Requests being served.
    serving: usize,
    /// Why the connection ended, once it has: every thread then leaves.
    ended: Option<Result<(), String>>,
}

impl<'a> Pool<'a> {
    /// One thread of the pool: lead, serve, and again, until the connection ends.
    fn work<'s>(&'s self, scope: &'s std::thread::Scope<'s, '_>)
    where
        'a: 's,
    {
        loop {
            {
                let mut st = self.state.lock();
                loop {
                    if st.ended.is_some() {
                        return;
                    }
                    if !st.leading {
                        st.leading = true;
                        break;
                    }
                    st.idle += 1;
                    self.turn.wait(&mut st);
                    st.idle -= 1;
                }
            }
            let frame = match self.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => return self.end(Ok(())),
                Err(e) => return self.end(Err(e)),
            };
            // Handing the lead on costs a wakeup of another thread per request: worth it when
            // requests overlap (more are waiting, another is being served) or this one may
            // take long; a cheap one alone is served before the lead is taken up again.
            let more = conn::frame_len(self.ch.lock().peek()).is_ok_and(|n| n.is_some());
            {
                let mut st = self.state.lock();
                st.leading = false;
                let hand_on = more || st.serving > 0 || !is_cheap(&frame);
                st.serving += 1;
                if hand_on && st.idle > 0 {
                    self.turn.notify_one();
                } else if hand_on && st.threads < MAX_WORKERS {
                    let spawned = std::thread::Builder::new()
                        .name("smithfs-remote".into())
                        .spawn_scoped(scope, move || self.work(scope));
                    if spawned.is_ok() {
                        st.threads += 1;
                    }
                }
            }
            let served = self.serve(&frame);
            self.state.lock().serving -= 1;
            if let Err(e) = served {
                return self.end(Err(e));
            }
        }
    }

    /// The connection ended (the first reason is kept): every thread leaves once its request
    /// is answered.
    fn end(&self, why: Result<(), String>) {
        let mut st = self.state.lock();
        if st.ended.is_none() {
            st.ended = Some(why);
        }
        self.turn.notify_all();
        drop(st);
        // Wake the leader if it waits on the socket.
        let _ = (&self.peer.wake).write(&[1]);
    }

    fn ended(&self) -> bool {
        self.state.lock().ended.is_some()
    }

    /// As the leader: the next request frame (out-of-band frames are handled here, in their
    /// order), sending queued notifications meanwhile; `None` at the peer's clean end.
    fn next_frame(&self) -> Result<Option<Vec<u8>>, String> {
        loop {
            // Once another thread ended the connection (a malformed frame), nothing more is
            // taken from it.
            if self.ended() {
                return Ok(None);
            }
            let (read, write) = {
                let mut ch = self.ch.lock();
                while let Some(n) = conn::frame_len(ch.peek()).map_err(|e| e.to_string())? {
                    let Some(frame) = ch.take(n) else { break };
                    if oob::is_oob(&frame) {
                        out_of_band(self.slot, &frame)?;
                        continue;
                    }
                    if is_forget(&frame) {
                        // Applied before any request read after it (no reply; a lock and a
                        // count): a node id forgotten is not the connection's for the next.
                        self.conn.serve(&frame).map_err(|e| e.to_string())?;
                        continue;
                    }
                    return Ok(Some(frame));
                }
                send_pending(self.peer, &mut ch)?;
                ch.flush().map_err(|e| e.to_string())?;
                if ch.eof() {
                    return if ch.buffered() > 0 {
                        Err(format!(
                            "truncated frame ({} bytes) at the end",
                            ch.buffered()
                        ))
                    } else {
                        Ok(None)
                    };
                }
                (ch.buffered() < MAX_FRAME, ch.wants_write())
            };
            let ready = wait_socket(
                &self.sock,
                read,
                write,
                Some(self.wake),
                None,
                Some(&self.poller),
            )?;
            if ready.extra {
                let mut sink = [0u8; 64];
                while matches!({ self.wake }.read(&mut sink), Ok(n) if n > 0) {}
            }
            if ready.socket {
                self.ch.lock().fill().map_err(|e| e.to_string())?;
            }
        }
    }

    /// Serve one request frame (what it changed is told by the connection's dispatcher, to
    /// every other kernel) and send its reply, after the notifications queued so far
    /// (docs/PROTOCOL-NOTES.md R9).
    fn serve(&self, frame: &[u8]) -> Result<(), String> {
        let reply = self.conn.serve(frame).map_err(|e| e.to_string())?;
        let mut ch = self.ch.lock();
        send_pending(self.peer, &mut ch)?;
        if let Some(reply) = reply {
            ch.send(&reply).map_err(|e| e.to_string())?;
        }
        // Sent before the next request is taken: a node that does not read its replies holds
        // up at most one request per thread (notes R7).
        while !ch.flush().map_err(|e| e.to_string())? {
            drop(ch);
            if self.ended() {
                return Ok(());
            }
            wait_socket(
                &self.sock,
                false,
                true,
                None,
                Some(Duration::from_secs(1)),
                None,
            )?;
            ch = self.ch.lock();
        }
        Ok(())
    }
}

/// Counts events that anyone can cause and says when to log them: at most once per
/// [`Throttle::EVERY`], with how many there were since the last time.
#[derive(Debug, Default)]
struct Throttle {
    count: u64,
    last: Option<std::time::Instant>,
}

impl Throttle {
    const EVERY: Duration = Duration::from_secs(10);

    /// One more; `Some(count)` when it is time to log them (the count then starts again).
    fn note(&mut self) -> Option<u64> {
        self.count += 1;
        if self.last.is_some_and(|t| t.elapsed() < Self::EVERY) {
            return None;
        }
        self.last = Some(std::time::Instant::now());
        Some(std::mem::take(&mut self.count))
    }
}

/// Whether the whole request `frame` is a FORGET or a BATCH_FORGET.
fn is_forget(frame: &[u8]) -> bool {
    use crate::fuse::wire::opcode;
    frame
        .get(4..8)
        .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        .is_some_and(|op| op == opcode::FORGET || op == opcode::BATCH_FORGET)
}

/// Whether the request `frame` is one the filesystem answers from what it holds, in a few
/// microseconds (metadata reads): not worth another thread's wakeup unless others wait.
fn is_cheap(frame: &[u8]) -> bool {
    use crate::fuse::wire::opcode;
    frame
        .get(4..8)
        .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        .is_some_and(|op| {
            matches!(
                op,
                opcode::LOOKUP
                    | opcode::GETATTR
                    | opcode::GETXATTR
                    | opcode::LISTXATTR
                    | opcode::ACCESS
                    | opcode::READLINK
                    | opcode::STATFS
            )
        })
}

/// Wait until `sock` is readable (when `read`) or writable (when `write`), or `extra` is
/// readable, or `timeout` passed (`None`: forever); busy-polling first with `poller`, if given.
fn wait_socket(
    sock: &TcpStream,
    read: bool,
    write: bool,
    extra: Option<&UnixStream>,
    timeout: Option<Duration>,
    poller: Option<&BusyPoller>,
) -> Result<super::channel::Ready, String> {
    let mut want = PollFlags::empty();
    if read {
        want |= PollFlags::POLLIN;
    }
    if write {
        want |= PollFlags::POLLOUT;
    }
    let mut fds = vec![PollFd::new(sock.as_fd(), want)];
    if let Some(e) = extra {
        fds.push(PollFd::new(e.as_fd(), PollFlags::POLLIN));
    }
    let t = timeout.map_or(PollTimeout::NONE, |d| {
        PollTimeout::try_from(d.as_millis().min(i32::MAX as u128) as i32)
            .unwrap_or(PollTimeout::MAX)
    });
    let polled = match poller {
        Some(p) => p.poll(&mut fds, t),
        None => nix::poll::poll(&mut fds, t),
    };
    match polled {
        Ok(_) | Err(nix::errno::Errno::EINTR) => {}
        Err(e) => return Err(format!("poll: {e}")),
    }
    let hit = |f: &PollFd<'_>, bits: PollFlags| {
        f.revents()
            .is_some_and(|r| r.intersects(bits | PollFlags::POLLHUP | PollFlags::POLLERR))
    };
    Ok(super::channel::Ready {
        socket: hit(&fds[0], PollFlags::POLLIN | PollFlags::POLLOUT),
        extra: fds.get(1).is_some_and(|f| hit(f, PollFlags::POLLIN)),
    })
}

/// An out-of-band frame (docs/PROTOCOL-NOTES.md R16): output into the run's output pipe, the
/// exit report kept for the launcher. Errors: the frame is malformed (the connection closes).
fn out_of_band(slot: &RunSlot, frame: &[u8]) -> Result<(), String> {
    match oob::decode(frame).map_err(|e| e.to_string())? {
        oob::Oob::Output(bytes) => {
            if slot.exit_report().is_some() {
                return Err(oob::OobError::AfterExit("output").to_string());
            }
            slot.output(bytes);
        }
        oob::Oob::Exit(r) => {
            if !slot.report(r) {
                return Err(oob::OobError::AfterExit("a second exit report").to_string());
            }
        }
    }
    Ok(())
}

/// Queue the notifications waiting for `peer` on its channel.
fn send_pending(peer: &Peer, ch: &mut Channel) -> Result<(), String> {
    if peer.overflowed.load(Ordering::Relaxed) {
        return Err("too many notifications pending: closed".into());
    }
    let pending: Vec<Vec<u8>> = peer.queue.lock().drain(..).collect();
    for n in pending {
        ch.send(&n).map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr};

    /// R50's eviction rule: of the source address holding the most unproven connections (the
    /// newcomer counted with its own; a tie goes to the newcomer's), the least far along, the
    /// oldest of those.
    #[test]
    fn the_source_holding_the_most_loses_its_least_advanced_connection() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        let keep: Vec<TcpStream> = (0..6)
            .map(|_| TcpStream::connect(addr).expect("connect"))
            .collect();
        let ip = |n: u8| Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, n)));
        let entry = |id: u64, source, stage: Stage| Unproven {
            id,
            source,
            stage: Arc::new(std::sync::atomic::AtomicU8::new(stage as u8)),
            sock: keep[id as usize].try_clone().expect("clone"),
        };
        // Oldest first: A handshaken, B silent, A talking, A silent, B handshaken.
        let q: VecDeque<Unproven> = [
            entry(0, ip(1), Stage::Handshaken),
            entry(1, ip(2), Stage::Silent),
            entry(2, ip(1), Stage::Talking),
            entry(3, ip(1), Stage::Silent),
            entry(4, ip(2), Stage::Handshaken),
        ]
        .into();
        // A holds 3: a newcomer from C (or from B: 3 with it, a tie that goes to B) ...
        assert_eq!(Shared::victim(&q, ip(3)), Some(3), "A's silent one");
        assert_eq!(Shared::victim(&q, ip(1)), Some(3), "A's silent one");
        assert_eq!(
            Shared::victim(&q, ip(2)),
            Some(1),
            "a tie: the newcomer's own"
        );
        // Without a silent one of A, its talking one; then its oldest handshaken.
        q[3].stage.store(Stage::Handshaken as u8, Ordering::Relaxed);
        assert_eq!(Shared::victim(&q, ip(3)), Some(2));
        q[2].stage.store(Stage::Handshaken as u8, Ordering::Relaxed);
        assert_eq!(Shared::victim(&q, ip(3)), Some(0));
        // Every address its own: the newcomer's has one (itself) as all do: the oldest.
        let spread: VecDeque<Unproven> = (0..4)
            .map(|i| entry(i, ip(10 + i as u8), Stage::Handshaken))
            .collect();
        assert_eq!(Shared::victim(&spread, ip(99)), Some(0));
    }

    #[test]
    fn a_throttle_says_the_first_event_then_the_count_once_per_interval() {
        let mut t = Throttle::default();
        assert_eq!(t.note(), Some(1));
        for _ in 0..5 {
            assert_eq!(t.note(), None);
        }
        t.last = t.last.map(|l| l - Throttle::EVERY);
        assert_eq!(t.note(), Some(6));
        assert_eq!(t.note(), None);
    }
}
