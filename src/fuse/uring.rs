//! FUSE over io_uring (kernel ≥ 6.14, `CONFIG_FUSE_IO_URING`, `Documentation/filesystems/fuse/
//! fuse-io-uring.rst`): once INIT has negotiated `FUSE_OVER_IO_URING`, every request but FORGET
//! and INTERRUPT is delivered through ring entries that the daemon registers on the FUSE device,
//! one queue per possible CPU; a request lands on the queue of the CPU its caller runs on.
//!
//! Each queue is one thread (pinned to its CPU) with its own ring (`IORING_SETUP_SQE128`) and
//! [`DEPTH`] entries. An entry is a 288-byte `fuse_uring_req_header` (the `fuse_in_header` /
//! `fuse_out_header`, the operation's fixed argument, `fuse_uring_ent_in_out`) and a payload
//! buffer of at least max(8 KiB, max_write, max_pages × 4 KiB). `IORING_OP_URING_CMD` with
//! `FUSE_IO_URING_CMD_REGISTER` hands an entry to the kernel; the kernel completes it when a
//! request is in it; `FUSE_IO_URING_CMD_COMMIT_AND_FETCH` sends the reply and re-arms the entry
//! in one SQE. At unmount (or abort) the kernel completes every entry with `-ENOTCONN` and the
//! queue thread ends.
//!
//! The kernel blocks every request until every queue has an entry, so a queue that cannot be
//! registered is fatal: [`start`] fails and the daemon exits, which aborts the connection (the
//! mount fails closed with ENOTCONN instead of hanging).
//!
//! While the CPUs have headroom the queue threads run at `SCHED_IDLE` ([`Headroom`]): a CPU
//! running only such a thread counts as idle, so the kernel wakes the caller a reply completes on
//! the CPU it slept on instead of moving it to the other idle one on nearly every request.

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use io_uring::{opcode, squeue, types, IoUring};

use super::dispatch::{Dispatcher, Reply};
use super::wire::{self, InHeader, Out};
use crate::fs::FsError;
use crate::sys::headroom::{set_policy_of, Headroom};

/// Ring entries per queue. Requests on one queue are served in order by its thread; a second
/// entry lets the kernel hand over the next request while the first is being answered. Each
/// entry's payload buffer is 1 MiB of address space with our max_write, touched only as far as
/// requests and replies reach (with passthrough, file data never does): 2 per CPU keeps the
/// daemon well inside its RSS goal (docs/PERFORMANCE.md).
pub const DEPTH: usize = 2;

/// `FUSE_IO_URING_CMD_REGISTER` (`enum fuse_uring_cmd`).
const CMD_REGISTER: u32 = 1;
/// `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`.
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// Size of `struct fuse_uring_req_header`.
const HEADER_LEN: usize = 288;
/// Offset of `op_in` in the header.
const OP_IN: usize = 128;
/// Offset of `fuse_uring_ent_in_out` in the header.
const ENT_IN_OUT: usize = 256;
/// Smallest payload buffer the kernel accepts (`FUSE_MIN_READ_BUFFER`).
const MIN_PAYLOAD: usize = 8192;

/// The payload buffer size for a connection with `max_write` and `max_pages` (the kernel's
/// `max_payload_sz`; REGISTER fails with EINVAL below it).
pub fn payload_size(max_write: u32, max_pages: u32) -> usize {
    let page = 4096usize;
    MIN_PAYLOAD
        .max(max_write as usize)
        .max(max_pages as usize * page)
}

/// Number of io_uring queues the kernel expects: one per possible CPU
/// (`/sys/devices/system/cpu/possible`, e.g. `0-1` or `0,2-3`).
pub fn possible_cpus() -> std::io::Result<usize> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    parse_cpu_list(s.trim())
        .ok_or_else(|| std::io::Error::other(format!("cannot parse CPU list {s:?}")))
}

/// Count the CPUs in a kernel CPU list (`0-3,5`).
fn parse_cpu_list(s: &str) -> Option<usize> {
    let mut n = 0;
    for part in s.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                n += b.checked_sub(a)? + 1;
            }
            None => {
                part.parse::<usize>().ok()?;
                n += 1;
            }
        }
    }
    (n > 0).then_some(n)
}

/// The daemon's headroom ([`Headroom`]), followed while queues serve (one mount per daemon).
///
/// Why it matters to the queue threads: when a queue thread completes a request, the kernel wakes the caller while
/// that thread still runs on the caller's CPU, so it places the caller on another idle CPU if
/// there is one; the caller's next request then lands on that CPU's queue, and the reply moves it
/// back: a migration (an inter-processor interrupt, in a VM an exit) on most requests of a
/// sequential workload (`git add`: 11 800 migrations for 16 500 requests; 3 400 with
/// passthrough_hp, whose shorter handling leaves the CPU sooner). A CPU whose only runnable
/// thread is `SCHED_IDLE` counts as idle, so the caller stays. But a `SCHED_IDLE` thread yields to
/// every other thread on its CPU: under CPU contention requests would wait behind busy tasks.
/// Hence the queue threads use `SCHED_IDLE` only while the CPUs are idle a good part of the time,
/// and the normal policy as soon as they are nearly all busy (docs/PROTOCOL-NOTES.md U8). CPU
/// pressure (PSI) would be the finer signal, but it counts the queue threads' own short waits
/// for the caller to block, which `SCHED_IDLE` makes frequent.
static HEADROOM: Headroom = Headroom::new();
/// Queues serving now, in this process.
static LIVE_QUEUES: AtomicUsize = AtomicUsize::new(0);
/// A thread follows [`HEADROOM`] now.
static WATCHING: AtomicBool = AtomicBool::new(false);
/// Thread ids of the queue threads serving now: the watcher sets their policy itself when the
/// headroom changes, so a thread asleep at `SCHED_IDLE` does not meet busy CPUs at that policy.
static QUEUE_TIDS: parking_lot::Mutex<Vec<libc::pid_t>> = parking_lot::const_mutex(Vec::new());

thread_local! {
    /// The calling thread runs at `SCHED_IDLE` (set by [`follow_headroom`]).
    static AT_IDLE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Put the calling thread on the policy [`Headroom`] asks for now, if that changed: a queue
/// thread when it starts (the watcher sets it on every later change), and the `/dev/fuse`
/// threads when they take a FORGET over io_uring (their work can wait; at the normal policy it
/// would run ahead of the queue threads' replies). One `sched_setscheduler` per change; nothing
/// while no queue serves (`/dev/fuse` transport).
pub fn follow_headroom() {
    let want = HEADROOM.idle();
    AT_IDLE.with(|at| {
        if at.get() != want && set_idle_policy(want) {
            at.set(want);
        }
    });
}

/// Run the calling thread at `SCHED_IDLE` (`idle`) or `SCHED_OTHER`; false when refused.
fn set_idle_policy(idle: bool) -> bool {
    set_policy_of(0, idle)
}

/// The running queues; [`Rings::join`] waits for their threads after unmount.
#[derive(Debug)]
pub struct Rings {
    threads: Vec<JoinHandle<()>>,
}

impl Rings {
    /// Number of queues serving.
    pub fn queues(&self) -> usize {
        self.threads.len()
    }

    /// Wait up to `patience` for every queue thread to end (they do once the kernel completes
    /// their entries at unmount); returns whether all did.
    pub fn join(self, patience: Duration) -> bool {
        let deadline = Instant::now() + patience;
        while self.threads.iter().any(|t| !t.is_finished()) {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        for t in self.threads {
            let _ = t.join();
        }
        true
    }
}

/// Register `depth` entries of `payload` bytes on every queue of the connection on `dev` and
/// serve them with `disp`. Returns once every queue is registered, or the first queue's error
/// (the caller must then end the daemon: the kernel waits for all queues).
pub fn start(
    dev: BorrowedFd<'_>,
    disp: Arc<Dispatcher>,
    payload: usize,
    depth: usize,
) -> std::io::Result<Rings> {
    let queues = possible_cpus()?;
    let dev = Arc::new(dev.try_clone_to_owned()?);
    let (tx, rx) = mpsc::channel();
    let mut threads = Vec::with_capacity(queues);
    for qid in 0..queues {
        let (dev, disp, tx) = (dev.clone(), disp.clone(), tx.clone());
        LIVE_QUEUES.fetch_add(1, Ordering::Relaxed);
        let spawned = std::thread::Builder::new()
            .name(format!("smithfs-uring-{qid}"))
            .spawn(move || {
                serve_queue(qid as u16, &dev, &disp, payload, depth, &tx);
                LIVE_QUEUES.fetch_sub(1, Ordering::Relaxed);
            });
        match spawned {
            Ok(t) => threads.push(t),
            Err(e) => {
                LIVE_QUEUES.fetch_sub(1, Ordering::Relaxed);
                return Err(e);
            }
        }
    }
    // Detached: it ends by itself within a period of the last queue.
    if !WATCHING.swap(true, Ordering::Relaxed) {
        std::thread::Builder::new()
            .name("smithfs-cpuload".into())
            .spawn(|| {
                // A change reaches the queue threads asleep or not (a thread that starts later
                // takes the policy itself, see `serve_queue`).
                HEADROOM.watch(
                    || LIVE_QUEUES.load(Ordering::Relaxed) > 0,
                    |idle| {
                        tracing::debug!(idle, "io_uring queue threads change policy");
                        for &tid in QUEUE_TIDS.lock().iter() {
                            set_policy_of(tid, idle);
                        }
                    },
                );
                WATCHING.store(false, Ordering::Relaxed);
            })?;
    }
    drop(tx);
    for _ in 0..queues {
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(std::io::Error::other("an io_uring queue did not register")),
        }
    }
    Ok(Rings { threads })
}

/// One ring entry: header and payload buffers at fixed addresses, owned by the kernel between
/// a submitted command and its completion.
struct Entry {
    header: Box<[u8; HEADER_LEN]>,
    payload: Box<[u8]>,
    iov: Box<[libc::iovec; 2]>,
}

fn cmd_req(commit_id: u64, qid: u16) -> [u8; 80] {
    // struct fuse_uring_cmd_req { u64 flags; u64 commit_id; u16 qid; u8 padding[6]; }
    let mut c = [0u8; 80];
    c[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    c[16..18].copy_from_slice(&qid.to_ne_bytes());
    c
}

fn register_sqe(dev: &OwnedFd, e: &mut Entry, idx: usize, qid: u16) -> squeue::Entry128 {
    e.iov[0] = libc::iovec {
        iov_base: e.header.as_mut_ptr().cast(),
        iov_len: HEADER_LEN,
    };
    e.iov[1] = libc::iovec {
        iov_base: e.payload.as_mut_ptr().cast(),
        iov_len: e.payload.len(),
    };
    let sqe = opcode::UringCmd80::new(types::Fd(dev.as_raw_fd()), CMD_REGISTER)
        .cmd(cmd_req(0, qid))
        .addr(Some(e.iov.as_ptr() as u64))
        .build()
        .user_data(idx as u64);
    with_len(sqe, 2)
}

/// Set `sqe->len`, which REGISTER needs (the iovec count) and the io-uring crate cannot set for
/// `URING_CMD` (tokio-rs/io-uring#374).
fn with_len(sqe: squeue::Entry128, len: u32) -> squeue::Entry128 {
    // SAFETY: `squeue::Entry128` is `#[repr(C)]`: a 64-byte `struct io_uring_sqe` followed by
    // 64 bytes of command, 128 bytes with no padding and no invalid bit patterns (plain integers
    // and byte arrays). `len` is the `__u32` at offset 24 of `struct io_uring_sqe`
    // (include/uapi/linux/io_uring.h), so the patched bytes are again a valid entry.
    unsafe {
        let mut raw: [u8; 128] = std::mem::transmute(sqe);
        raw[24..28].copy_from_slice(&len.to_ne_bytes());
        std::mem::transmute::<[u8; 128], squeue::Entry128>(raw)
    }
}

fn commit_sqe(dev: &OwnedFd, commit_id: u64, idx: usize, qid: u16) -> squeue::Entry128 {
    opcode::UringCmd80::new(types::Fd(dev.as_raw_fd()), CMD_COMMIT_AND_FETCH)
        .cmd(cmd_req(commit_id, qid))
        .build()
        .user_data(idx as u64)
}

fn pin_to_cpu(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    if set.set(cpu).is_ok() {
        // Best effort: a CPU that is possible but not online cannot be pinned to.
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set);
    }
}

/// Takes a queue thread off [`QUEUE_TIDS`] when it ends, however it ends.
struct TidListed(libc::pid_t);

impl Drop for TidListed {
    fn drop(&mut self) {
        QUEUE_TIDS.lock().retain(|&t| t != self.0);
    }
}

/// Register `depth` entries of queue `qid` and serve them until the kernel ends them.
fn serve_queue(
    qid: u16,
    dev: &OwnedFd,
    disp: &Dispatcher,
    payload: usize,
    depth: usize,
    ready: &mpsc::Sender<std::io::Result<()>>,
) {
    pin_to_cpu(qid as usize);
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    QUEUE_TIDS.lock().push(tid);
    let _listed = TidListed(tid);
    // Listed first, then the current policy taken: a change after this reaches it through the
    // list (the watcher's change).
    follow_headroom();
    let mut ring: IoUring<squeue::Entry128> = match IoUring::builder().build(depth as u32) {
        Ok(r) => r,
        Err(e) => {
            let _ = ready.send(Err(std::io::Error::other(format!(
                "cannot create the io_uring of queue {qid}: {e}"
            ))));
            return;
        }
    };
    let mut entries: Vec<Entry> = (0..depth)
        .map(|_| Entry {
            header: Box::new([0u8; HEADER_LEN]),
            payload: vec![0u8; payload].into_boxed_slice(),
            iov: Box::new(
                [libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                }; 2],
            ),
        })
        .collect();
    for (idx, e) in entries.iter_mut().enumerate() {
        let sqe = register_sqe(dev, e, idx, qid);
        // SAFETY: the entry's buffers and iovecs live in `entries`, which outlives the ring's
        // use of them (the thread returns only after every entry completed or was abandoned at
        // teardown, and the kernel copies the iovec array during submission).
        if unsafe { ring.submission().push(&sqe) }.is_err() {
            let _ = ready.send(Err(std::io::Error::other("io_uring submission queue full")));
            return;
        }
    }
    if let Err(e) = ring.submit() {
        let _ = ready.send(Err(std::io::Error::other(format!(
            "cannot register io_uring queue {qid}: {e}"
        ))));
        return;
    }
    // A refused REGISTER completes at once with a negative result; a successful one completes
    // only when a request arrives (result 0).
    let early: Vec<(u64, i32)> = ring
        .completion()
        .map(|c| (c.user_data(), c.result()))
        .collect();
    if let Some((_, res)) = early.iter().find(|(_, r)| *r < 0) {
        let _ = ready.send(Err(std::io::Error::other(format!(
            "FUSE_IO_URING_CMD_REGISTER on queue {qid} failed: {}",
            std::io::Error::from_raw_os_error(-res)
        ))));
        return;
    }
    let _ = ready.send(Ok(()));
    tracing::debug!(qid, depth, payload, "io_uring queue registered");
    let mut live = depth;
    let mut pending = early;
    loop {
        for (idx, res) in pending.drain(..) {
            let idx = idx as usize;
            if res < 0 {
                // Teardown (ENOTCONN at unmount, ECANCELED at exit) or a refused commit.
                if res != -libc::ENOTCONN && res != -libc::ECANCELED {
                    tracing::warn!(
                        qid,
                        "io_uring entry ended: {}",
                        std::io::Error::from_raw_os_error(-res)
                    );
                }
                live -= 1;
                continue;
            }
            let Some(e) = entries.get_mut(idx) else {
                continue;
            };
            let commit_id = serve_entry(disp, e);
            let sqe = commit_sqe(dev, commit_id, idx, qid);
            // SAFETY: as for REGISTER: the entry's buffers stay registered and alive.
            if unsafe { ring.submission().push(&sqe) }.is_err() {
                tracing::error!(qid, "io_uring submission queue full");
                live -= 1;
            }
        }
        if live == 0 {
            break;
        }
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) => {
                tracing::error!(qid, "io_uring wait failed: {e}");
                break;
            }
        }
        pending.extend(ring.completion().map(|c| (c.user_data(), c.result())));
    }
    tracing::debug!(qid, "io_uring queue ended");
}

/// Decode the request in `e`, dispatch it and write the reply into `e`; returns the commit id.
fn serve_entry(disp: &Dispatcher, e: &mut Entry) -> u64 {
    let hdr = &mut e.header;
    let commit_id = u64::from_ne_bytes(
        hdr[ENT_IN_OUT + 8..ENT_IN_OUT + 16]
            .try_into()
            .unwrap_or_default(),
    );
    let payload_sz = u32::from_ne_bytes(
        hdr[ENT_IN_OUT + 16..ENT_IN_OUT + 20]
            .try_into()
            .unwrap_or_default(),
    ) as usize;
    let (unique, reply) = match InHeader::decode(&hdr[..wire::IN_HEADER_LEN]) {
        Ok(h) => {
            let arg_end = OP_IN + wire::arg_len(h.opcode).min(ENT_IN_OUT - OP_IN);
            let arg = &hdr[OP_IN..arg_end];
            let body = &e.payload[..payload_sz.min(e.payload.len())];
            let reply = disp.serve_framed(&h, arg, body);
            (h.unique, reply)
        }
        Err(_) => (commit_id, Reply::Error(FsError::BadRequest.raw())),
    };
    let mut out = Out::new(&mut e.payload);
    let error = reply.encode(&mut out);
    let len = out.len();
    hdr[..wire::OUT_HEADER_LEN].copy_from_slice(&wire::out_header(unique, error, len));
    hdr[ENT_IN_OUT + 16..ENT_IN_OUT + 20].copy_from_slice(&(len as u32).to_ne_bytes());
    commit_id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        for (s, n) in [
            ("0", Some(1)),
            ("0-1", Some(2)),
            ("0-3,5", Some(5)),
            ("0,2-3", Some(3)),
            ("", None),
            ("x", None),
            ("3-1", None),
        ] {
            assert_eq!(parse_cpu_list(s), n, "{s:?}");
        }
    }

    #[test]
    fn payload_is_at_least_the_kernels_max_payload() {
        assert_eq!(payload_size(4096, 1), 8192);
        assert_eq!(payload_size(1 << 20, 256), 1 << 20);
        assert_eq!(payload_size(1 << 20, 257), 257 * 4096);
    }

    #[test]
    fn register_sqe_carries_len_and_iovecs() {
        let dev = std::fs::File::open("/dev/null").unwrap();
        let dev = OwnedFd::from(dev);
        let mut e = Entry {
            header: Box::new([0u8; HEADER_LEN]),
            payload: vec![0u8; 8192].into_boxed_slice(),
            iov: Box::new(
                [libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                }; 2],
            ),
        };
        let sqe = register_sqe(&dev, &mut e, 3, 1);
        // SAFETY: as in `with_len`.
        let raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
        assert_eq!(raw[0], opcode::UringCmd80::CODE);
        assert_eq!(u32::from_ne_bytes(raw[24..28].try_into().unwrap()), 2);
        assert_eq!(
            u64::from_ne_bytes(raw[16..24].try_into().unwrap()),
            e.iov.as_ptr() as u64
        );
        assert_eq!(
            u32::from_ne_bytes(raw[8..12].try_into().unwrap()),
            CMD_REGISTER
        );
        assert_eq!(u64::from_ne_bytes(raw[32..40].try_into().unwrap()), 3);
        // fuse_uring_cmd_req.qid in the command area (offset 48 + 16).
        assert_eq!(u16::from_ne_bytes(raw[64..66].try_into().unwrap()), 1);
        assert_eq!(e.iov[0].iov_len, HEADER_LEN);
        assert_eq!(e.iov[1].iov_len, 8192);
    }
}
