//! The output pump (docs/SPEC.md §5, §8; docs/PROTOCOL-NOTES.md L17): a run's stdout and stderr
//! (and a hook's) go into a pipe, and one thread drains every pipe into its log —
//! `conversations/<run-id>/messages.log`, `.smithfs-state/hooks.log` — so that what a run
//! prints is bounded like anything else it writes: charged to its smith's storage quota and
//! stopped at the store's reserve. Beyond the bound the output is read and dropped (the writer
//! never blocks for ever, never gets `EPIPE` or `SIGPIPE`), with one marker line in the log and,
//! for a run, one `run.output_dropped` journal event.
//!
//! One `epoll` set holds every pipe's read end (level-triggered, non-blocking); a stream leaves
//! it at end of file (every writer closed it). After a write the log's inode is invalidated in
//! the kernel's cache (at most every [`INVALIDATE_EVERY`] per log while it grows, and once at
//! its end), so readers through the mount (`smithfs logs --follow`) see it grow however long
//! the kernel caches attributes. [`Pump::drain`] takes what a stream holds now on the caller's
//! thread: the scheduler calls it when a run's leader has exited, before it journals the end,
//! so the log is complete when `run.exited` is.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::journal::{Event, Journal};
use super::{Invalidate, Msg};
use crate::backing::{self, BackingIno};
use crate::limits::storage::{Home, Storage};
use crate::policy::{Rule, StorageBound};
use crate::tree::model::FullId;

/// The longest a growing log goes without an invalidation of its inode in the kernel's cache.
pub const INVALIDATE_EVERY: Duration = Duration::from_millis(200);

/// Bytes read from a pipe at once.
const CHUNK: usize = 64 << 10;

/// Reads of one stream by [`Pump::drain`] at most.
const DRAIN_TURNS: usize = 64;

/// Reads of one stream per turn of the pump (the others get theirs).
const TURN: usize = 16;

/// Where one stream goes.
pub struct Sink {
    /// The log, open for appending.
    pub log: OwnedFd,
    /// Its backing inode number (for the kernel's cache).
    pub log_ino: BackingIno,
    /// Who pays for it (`None`: nobody; the reserve still bounds it).
    pub home: Option<Home>,
    /// The run's smith (full id) and run id, for the journal; `None` for a hook (its drops are
    /// only logged: a journal event could fire a hook whose output is dropped again).
    pub run: Option<(FullId, String)>,
    /// The log's mount-relative path, for the journal.
    pub path: String,
    /// Masks the secrets' values in what is written (a run's log, docs/SPEC.md §12); `None`:
    /// written as read.
    pub mask: Option<crate::sandbox::secrets::Masker>,
}

/// One pipe being drained.
struct Stream {
    read: OwnedFd,
    sink: Sink,
    /// The log's size as last known.
    size: u64,
    /// Bytes dropped since the bound was met (the rest of the stream is dropped).
    dropped: Option<u64>,
    /// Written since the last invalidation.
    dirty: bool,
    last_invalidated: Instant,
}

/// A handle to one stream registered with [`Pump::add`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StreamId(u64);

struct Inner {
    epoll: OwnedFd,
    /// Leaf lock, held only to insert, remove or clone out a stream.
    streams: Mutex<HashMap<u64, Arc<Mutex<Stream>>>>,
    next: AtomicU64,
    storage: Arc<Storage>,
    invalidate: Arc<dyn Invalidate>,
    journal: Arc<Journal>,
    /// The scheduler's queue: `run.output_dropped` is journaled there (with its hooks).
    tx: Option<SyncSender<Msg>>,
}

/// The output pump: one thread for every run's and hook's output (see the module header).
#[derive(Clone)]
pub struct Pump {
    inner: Arc<Inner>,
}

/// A pipe for a process's stdout and stderr: (read end, non-blocking; write end, blocking),
/// both close-on-exec (the spawn dups the write end onto 1 and 2).
///
/// # Errors
/// `pipe2` or `fcntl`'s.
pub fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    let flags = rustix::fs::fcntl_getfl(&r)?;
    rustix::fs::fcntl_setfl(&r, flags | rustix::fs::OFlags::NONBLOCK)?;
    Ok((r, w))
}

impl Pump {
    /// Start the pump's thread.
    ///
    /// # Errors
    /// `epoll_create1` or the thread's spawn.
    pub(crate) fn start(
        storage: Arc<Storage>,
        invalidate: Arc<dyn Invalidate>,
        journal: Arc<Journal>,
        tx: Option<SyncSender<Msg>>,
    ) -> std::io::Result<Pump> {
        // SAFETY: plain syscall.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor we own.
        let epoll = unsafe { OwnedFd::from_raw_fd(ep) };
        let inner = Arc::new(Inner {
            epoll,
            streams: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            storage,
            invalidate,
            journal,
            tx,
        });
        let weak = Arc::downgrade(&inner);
        std::thread::Builder::new()
            .name("smithfs-output".into())
            .spawn(move || run(&weak))?;
        Ok(Pump { inner })
    }

    /// Drain `read` (a pipe's read end from [`pipe`]) into `sink` until every writer closed it.
    ///
    /// # Errors
    /// `epoll_ctl`'s (the stream is then not drained: the caller should not start the writer).
    pub fn add(&self, read: OwnedFd, sink: Sink) -> std::io::Result<StreamId> {
        let size = backing::stat(sink.log.as_fd()).map_or(0, |st| st.st_size as u64);
        let id = self.inner.next.fetch_add(1, Ordering::Relaxed);
        let fd = read.as_raw_fd();
        let stream = Stream {
            read,
            sink,
            size,
            dropped: None,
            dirty: false,
            last_invalidated: Instant::now(),
        };
        self.inner
            .streams
            .lock()
            .insert(id, Arc::new(Mutex::new(stream)));
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLHUP) as u32,
            u64: id,
        };
        // SAFETY: valid descriptors and event.
        if unsafe {
            libc::epoll_ctl(
                self.inner.epoll.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                fd,
                &mut ev,
            )
        } != 0
        {
            let e = std::io::Error::last_os_error();
            self.inner.streams.lock().remove(&id);
            return Err(e);
        }
        Ok(StreamId(id))
    }

    /// Take what stream `id` holds now into its log, on this thread, and invalidate the log in
    /// the kernel's cache: called once a run's leader has exited, so everything it wrote is in
    /// the log before its end is journaled. A stream already at its end is left alone.
    pub fn drain(&self, id: StreamId) {
        // The leader is gone, so the pipe holds at most its capacity (64 KiB by default, 1 MiB
        // at most unprivileged): a bounded number of reads, even while an orphan still writes.
        self.inner.pump(id.0, DRAIN_TURNS);
        if let Some(s) = self.inner.get(id.0) {
            let mut s = s.lock();
            self.inner.flush_invalidation(&mut s, true);
        }
    }

    /// Streams being drained (for tests and status).
    pub fn len(&self) -> usize {
        self.inner.streams.lock().len()
    }

    /// No stream is being drained.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The pump thread: wait for readable pipes, drain each a turn, invalidate logs that grew.
/// Ends when the pump is dropped (checked at least every second).
fn run(inner: &std::sync::Weak<Inner>) {
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 64];
    loop {
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let dirty = inner.any_dirty();
        let timeout = if dirty {
            INVALIDATE_EVERY.as_millis() as i32
        } else {
            1000
        };
        // SAFETY: `events` is a valid buffer of its length.
        let n = unsafe {
            libc::epoll_wait(
                inner.epoll.as_raw_fd(),
                events.as_mut_ptr(),
                events.len() as i32,
                timeout,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                tracing::error!("output pump: epoll_wait: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
            continue;
        }
        for ev in &events[..n as usize] {
            inner.pump(ev.u64, TURN);
        }
        let all: Vec<Arc<Mutex<Stream>>> = inner.streams.lock().values().cloned().collect();
        for s in all {
            let mut s = s.lock();
            inner.flush_invalidation(&mut s, false);
        }
    }
}

impl Inner {
    fn get(&self, id: u64) -> Option<Arc<Mutex<Stream>>> {
        self.streams.lock().get(&id).cloned()
    }

    fn any_dirty(&self) -> bool {
        let all: Vec<Arc<Mutex<Stream>>> = self.streams.lock().values().cloned().collect();
        all.iter().any(|s| s.lock().dirty)
    }

    /// Read stream `id` up to `turns` chunks (until the pipe is empty); at end of file,
    /// invalidate its log a last time and forget it.
    fn pump(&self, id: u64, turns: usize) {
        let Some(stream) = self.get(id) else {
            return;
        };
        // The stream's own lock: held across its reads and writes, so the pump thread and a
        // drain never interleave one stream's chunks.
        let mut s = stream.lock();
        let mut buf = vec![0u8; CHUNK];
        let mut eof = false;
        for _ in 0..turns {
            // SAFETY: `buf` is a valid writable buffer of its length.
            let n = unsafe { libc::read(s.read.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                match std::io::Error::last_os_error().raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::EAGAIN) => break,
                    e => {
                        tracing::warn!(path = %s.sink.path, "output pump: read: {e:?}");
                        eof = true;
                        break;
                    }
                }
            }
            if n == 0 {
                eof = true;
                break;
            }
            let chunk = &buf[..n as usize];
            match s.sink.mask.as_mut().map(|m| m.push(chunk)) {
                Some(masked) => self.deliver(&mut s, &masked),
                None => self.deliver(&mut s, chunk),
            }
        }
        if eof {
            // What the masker held back could begin a secret but is none: written now.
            if let Some(rest) = s.sink.mask.as_mut().map(|m| m.finish()) {
                if !rest.is_empty() {
                    self.deliver(&mut s, &rest);
                }
            }
            self.flush_invalidation(&mut s, true);
            // SAFETY: removing a descriptor we own from our epoll set.
            unsafe {
                libc::epoll_ctl(
                    self.epoll.as_raw_fd(),
                    libc::EPOLL_CTL_DEL,
                    s.read.as_raw_fd(),
                    std::ptr::null_mut(),
                );
            }
            drop(s);
            self.streams.lock().remove(&id);
        }
    }

    /// Append `data` to the stream's log if its bound admits it, else drop it (the first time
    /// with a marker line and a journal event).
    fn deliver(&self, s: &mut Stream, data: &[u8]) {
        if let Some(d) = s.dropped.as_mut() {
            *d = d.saturating_add(data.len() as u64);
            return;
        }
        // The log is dense and appended to: only the blocks past its end are new.
        let up = |n: u64| n.saturating_add(4095) & !4095;
        let adds = up(s.size.saturating_add(data.len() as u64)) - up(s.size);
        let refused = match self.storage.admit_reserve(adds, 0) {
            Err(r) => Some((
                Rule::StoreReserve.id(),
                format!(
                    "the store has {} bytes free and keeps {} for the daemon",
                    r.free, r.reserve
                ),
            )),
            Ok(()) => match s
                .sink
                .home
                .map(|h| self.storage.admit_output(h.payer, adds))
            {
                Some(Err(StorageBound::Bytes { limit, used, .. })) => Some((
                    Rule::StorageBytes.id(),
                    format!(
                        "the smith holds {used} bytes; a run's output stops at {limit}, a \
                         sixteenth short of its limits.max_bytes_per_smith"
                    ),
                )),
                Some(Err(StorageBound::Inodes { .. } | StorageBound::Reserve { .. }))
                | Some(Ok(()))
                | None => None,
            },
        };
        if let Some((rule, why)) = refused {
            return self.start_dropping(s, data.len() as u64, Some(rule), &why);
        }
        if let Err(e) = write_all(s.sink.log.as_fd(), data) {
            let why = format!("cannot write the log: {e}");
            return self.start_dropping(s, data.len() as u64, None, &why);
        }
        s.size = s.size.saturating_add(data.len() as u64);
        self.settle(s);
    }

    /// The bound was met: one marker line (the daemon's own write), one journal event for a
    /// run, and the rest of the stream is dropped.
    fn start_dropping(&self, s: &mut Stream, bytes: u64, rule: Option<&str>, why: &str) {
        s.dropped = Some(bytes);
        let line = match rule {
            Some(rule) => {
                format!("smithfs: output dropped from here to the end of the run: {why} ({rule})\n")
            }
            None => format!("smithfs: output dropped from here to the end of the run: {why}\n"),
        };
        if write_all(s.sink.log.as_fd(), line.as_bytes()).is_ok() {
            s.size = s.size.saturating_add(line.len() as u64);
        }
        self.settle(s);
        self.flush_invalidation(s, true);
        tracing::warn!(path = %s.sink.path, rule = rule.unwrap_or(""), "output dropped: {why}");
        let Some((smith, run_id)) = s.sink.run.clone() else {
            return;
        };
        let mut ev = Event::new("run.output_dropped", Some(smith));
        ev.run_id = Some(run_id);
        ev.path = Some(s.sink.path.clone());
        ev.rule = rule.map(String::from);
        ev.error = Some(why.to_string());
        let queued = self
            .tx
            .as_ref()
            .is_some_and(|tx| tx.try_send(Msg::Journal(Box::new(ev.clone()))).is_ok());
        if !queued {
            let _ = self.journal.append(&ev);
        }
    }

    /// The books take the log's allocation as it is now; the kernel is told it grew.
    fn settle(&self, s: &mut Stream) {
        if s.sink.home.is_some() {
            if let Some(st) = self.storage.charge_fd(s.sink.log.as_fd(), s.sink.home) {
                s.size = st.st_size as u64;
            }
        }
        s.dirty = true;
        self.flush_invalidation(s, false);
    }

    /// Invalidate the log in the kernel's cache if it grew and (unless `now`) the last
    /// invalidation is [`INVALIDATE_EVERY`] old. This is the hook that keeps readers through
    /// the mount current whatever the attribute timeout.
    fn flush_invalidation(&self, s: &mut Stream, now: bool) {
        if s.dirty && (now || s.last_invalidated.elapsed() >= INVALIDATE_EVERY) {
            self.invalidate.inode(s.sink.log_ino);
            s.dirty = false;
            s.last_invalidated = Instant::now();
        }
    }
}

/// Write all of `data` to the `O_APPEND` descriptor `fd`.
fn write_all(fd: BorrowedFd<'_>, mut data: &[u8]) -> crate::backing::SysResult<()> {
    while !data.is_empty() {
        let n = backing::write(fd, data)?;
        if n == 0 {
            return Err(backing::Refused::WroteNothing.into());
        }
        data = &data[n..];
    }
    Ok(())
}
