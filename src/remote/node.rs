//! The node's FUSE mount (docs/SPEC.md §13, `smithfs attach`): a mount at the daemon's path in
//! this process's own mount namespace, whose INIT the node answers itself at its kernel's minor
//! (docs/PROTOCOL-NOTES.md R5), and whose every other request is forwarded over the run's
//! [`Channel`] as it is, with the daemon's replies and notifications written back to the
//! kernel as they are. The connection dropping ends the forwarding: from then on every request
//! to the mount is answered ENOTCONN (fail closed; docs/PROTOCOL-NOTES.md R42).

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout};

use super::busy_poll::BusyPoller;
use super::channel::Channel;
use super::oob;
use crate::fuse::wire::{self, opcode, IN_HEADER_LEN, OUT_HEADER_LEN};

/// The newest protocol minor the node agrees to: what the daemon's codec decodes (INIT is
/// answered by the one negotiation of `crate::fuse::init`, as the daemon's own mount does).
pub const MAX_MINOR: u32 = crate::fuse::init::MAX_MINOR;

/// What INIT settled with the node's kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Init {
    /// The kernel's minor.
    pub kernel_minor: u32,
    /// The minor agreed (the kernel's, at most [`MAX_MINOR`]).
    pub minor: u32,
    /// The largest write the kernel sends, bytes.
    pub max_write: u32,
}

/// Enter a mount namespace of this process's own, with every mount private to it (nothing
/// mounted here is seen by the host, and the daemon's own mount at the same path stays as it
/// is outside).
///
/// # Errors
/// `unshare` or the remount failed (not root, or no CAP_SYS_ADMIN).
pub fn private_namespace() -> Result<(), String> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
        .map_err(|e| format!("cannot make a mount namespace (root is needed): {e}"))?;
    mounts_private()
}

/// Every mount of this process's (new) mount namespace made private: nothing mounted here
/// propagates to the namespace it came from.
fn mounts_private() -> Result<(), String> {
    use nix::mount::{mount, MsFlags};
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| format!("cannot make the mounts private: {e}"))
}

/// For an `attach` that is not root (docs/SPEC.md §13 "a user namespace when not root",
/// docs/PROTOCOL-NOTES.md R32): a user namespace and a mount namespace of this process's own,
/// in which it has the capabilities to mount FUSE, every mount made private. Its uid and gid
/// are mapped to `inside` (the run's uid and gid as the daemon numbers them, so that the
/// remote mount's owners, which the kernel maps through this namespace, are the run's own)
/// or, without one, to themselves; never to root. Only the one uid and gid exist in it;
/// `setgroups` is denied. Must be called while this process has one thread.
///
/// # Errors
/// One sentence: the kernel refused the namespace (unprivileged user namespaces off?) or a
/// map, or `inside` names root.
pub fn own_user_namespace(inside: Option<(u32, u32)>) -> Result<(), String> {
    // SAFETY: geteuid and getegid have no preconditions.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let (in_uid, in_gid) = inside.unwrap_or((uid, gid));
    if in_uid == 0 || in_gid == 0 {
        return Err("the run's uid or gid is root: refused".into());
    }
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER | nix::sched::CloneFlags::CLONE_NEWNS)
        .map_err(|e| {
            format!(
                "cannot make a user namespace ({e}): allow unprivileged user namespaces \
                 (sysctl user.max_user_namespaces, kernel.unprivileged_userns_clone) or attach as root"
            )
        })?;
    for (file, text) in [
        ("/proc/self/setgroups", "deny".to_string()),
        ("/proc/self/uid_map", format!("{in_uid} {uid} 1\n")),
        ("/proc/self/gid_map", format!("{in_gid} {gid} 1\n")),
    ] {
        std::fs::write(file, text).map_err(|e| format!("cannot write {file}: {e}"))?;
    }
    mounts_private()
}

/// Mount FUSE at `dir` (made when missing) and answer the kernel's INIT on it.
///
/// # Errors
/// One sentence: the directory, the mount, or an INIT the node cannot answer.
pub fn mount(dir: &Path, allow_other: bool, max_write: u32) -> Result<(OwnedFd, Init), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
    let (dev, _via) =
        crate::fuse::mount::mount(dir, allow_other, true).map_err(|e| format!("{e:#}"))?;
    let init = answer_init(&dev, max_write)?;
    Ok((dev, init))
}

/// Read the kernel's INIT from `dev` and reply to it with the flags the daemon's own mount asks
/// for, without passthrough and io_uring (nothing local to pass through; `crate::fuse::init`).
fn answer_init(dev: &OwnedFd, max_write: u32) -> Result<Init, String> {
    let offer = crate::fuse::init::Offer {
        passthrough: false,
        io_uring: crate::fuse::transport::Transport::DevFuse,
        max_write,
    };
    let s = crate::fuse::init::answer(dev.as_fd(), &offer)?;
    Ok(Init {
        kernel_minor: s.kernel_minor,
        minor: s.minor,
        max_write: s.max_write,
    })
}

/// The connection is gone: what COMMAND still writes goes to this process's own stdout (a
/// launcher's log, or nowhere) until its end of file, or until `grace` after the stop, so that
/// COMMAND neither blocks on a full pipe nor dies of SIGPIPE for want of a reader.
fn relay_locally(
    out: &OwnedFd,
    stop: std::os::fd::BorrowedFd<'_>,
    mut stopping: Option<Instant>,
    grace: Duration,
) {
    let mut chunk = vec![0u8; oob::MAX_OUTPUT];
    loop {
        if stopping.is_some_and(|since| since.elapsed() > grace) {
            return;
        }
        let mut fds = [
            PollFd::new(out.as_fd(), PollFlags::POLLIN),
            PollFd::new(stop, PollFlags::POLLIN),
        ];
        if let Err(e) = nix::poll::poll(&mut fds, PollTimeout::from(100u8)) {
            if e != nix::errno::Errno::EINTR {
                return;
            }
        }
        if stopping.is_none() && fds[1].revents().is_some_and(|r| !r.is_empty()) {
            stopping = Some(Instant::now());
        }
        match nix::unistd::read(out.as_raw_fd(), &mut chunk) {
            Ok(0) => return,
            Ok(n) => {
                let mut stdout = std::io::stdout().lock();
                let _ = std::io::Write::write_all(&mut stdout, &chunk[..n]);
                let _ = std::io::Write::flush(&mut stdout);
            }
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => {}
            Err(_) => return,
        }
    }
}

/// The exit report's frame written to the stop pipe, if what is there is one.
fn read_report(stop: std::os::fd::BorrowedFd<'_>) -> Option<Vec<u8>> {
    let mut b = [0u8; 64];
    let n = nix::unistd::read(stop.as_raw_fd(), &mut b).ok()?;
    let frame = &b[..n];
    (oob::is_oob(frame) && matches!(oob::decode(frame), Ok(oob::Oob::Exit(_))))
        .then(|| frame.to_vec())
}

fn write_dev(dev: &OwnedFd, frame: &[u8]) -> nix::Result<usize> {
    nix::unistd::write(dev, frame)
}

/// How forwarding ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// The `stop` descriptor of [`Forwarder::run`] became readable and every handle was released (or the grace ran out).
    Stopped,
    /// The connection dropped or broke: the mount now fails closed.
    Dropped(String),
    /// The kernel ended the mount (unmounted).
    Unmounted,
}

/// Forwards one mount's requests over one channel.
pub struct Forwarder {
    dev: OwnedFd,
    ch: Channel,
    buf: Vec<u8>,
    /// Requests forwarded and not yet answered: unique → opcode.
    inflight: HashMap<u64, u32>,
    /// File and directory handles the kernel holds (opened and not yet released).
    handles: i64,
    /// Notifications go to the kernel from a thread of their own: INVAL_ENTRY waits for the
    /// directory's lock, which a request waiting for its reply (from this thread) may hold.
    notes: std::sync::mpsc::Sender<Vec<u8>>,
    /// The read end of COMMAND's stdout and stderr, sent as output frames until its end
    /// (docs/PROTOCOL-NOTES.md R16); `None`: none, or at its end.
    output: Option<OwnedFd>,
}

impl std::fmt::Debug for Forwarder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forwarder")
            .field("inflight", &self.inflight.len())
            .field("handles", &self.handles)
            .finish_non_exhaustive()
    }
}

impl Forwarder {
    /// Forward `dev`'s requests (after INIT) over `ch`; `init` sizes the read buffer.
    ///
    /// # Errors
    /// The notification thread could not be started.
    pub fn new(dev: OwnedFd, ch: Channel, init: Init) -> Result<Forwarder, String> {
        let (notes, rx) = std::sync::mpsc::channel::<Vec<u8>>();
        let ndev = dev.try_clone().map_err(|e| e.to_string())?;
        std::thread::Builder::new()
            .name("smithfs-notify".into())
            .spawn(move || {
                for frame in rx {
                    if let Err(nix::errno::Errno::ENODEV) = write_dev(&ndev, &frame) {
                        return;
                    }
                }
            })
            .map_err(|e| format!("cannot start the notification thread: {e}"))?;
        Ok(Forwarder {
            notes,
            dev,
            ch,
            buf: vec![0u8; init.max_write as usize + 64 * 1024],
            inflight: HashMap::new(),
            handles: 0,
            output: None,
        })
    }

    /// Send what is read from `read` (COMMAND's stdout and stderr) to the daemon as output
    /// frames (docs/PROTOCOL-NOTES.md R16), read only while nothing else waits to be sent (a
    /// slow connection holds COMMAND's writes back), to its end of file before the exit report.
    ///
    /// # Errors
    /// The descriptor could not be made non-blocking.
    pub fn with_output(mut self, read: OwnedFd) -> Result<Forwarder, String> {
        use nix::fcntl::{fcntl, FcntlArg, OFlag};
        let flags = fcntl(read.as_raw_fd(), FcntlArg::F_GETFL).map_err(|e| e.to_string())?;
        let flags = OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK;
        fcntl(read.as_raw_fd(), FcntlArg::F_SETFL(flags)).map_err(|e| e.to_string())?;
        self.output = Some(read);
        Ok(self)
    }

    /// Forward until `stop` becomes readable, then until the kernel released every handle
    /// (files closed by the run's processes reach the daemon as RELEASE, so their completions
    /// trigger) and the output reached its end, or `grace` passed; or until the connection
    /// drops or the mount ends. What `stop` carries, if it is an exit report's frame
    /// ([`oob::exit`]), is sent last. Closes the channel (gracefully when stopped) and
    /// `/dev/fuse`.
    pub fn run(mut self, stop: std::os::fd::BorrowedFd<'_>, grace: Duration) -> Ended {
        let poller = BusyPoller::new();
        let mut stopping: Option<Instant> = None;
        let mut report: Option<Vec<u8>> = None;
        let ended = loop {
            if let Some(since) = stopping {
                let drained =
                    self.handles <= 0 && self.inflight.is_empty() && self.output.is_none();
                if drained || since.elapsed() > grace {
                    break Ended::Stopped;
                }
            }
            let want_sock = PollFlags::POLLIN
                | if self.ch.wants_write() {
                    PollFlags::POLLOUT
                } else {
                    PollFlags::empty()
                };
            // Output is read only while nothing waits to be sent: the socket paces COMMAND.
            let out_flags = if self.ch.wants_write() {
                PollFlags::empty()
            } else {
                PollFlags::POLLIN
            };
            let mut fds = vec![
                PollFd::new(self.ch.socket().as_fd(), want_sock),
                PollFd::new(self.dev.as_fd(), PollFlags::POLLIN),
                PollFd::new(stop, PollFlags::POLLIN),
            ];
            if let Some(fd) = &self.output {
                fds.push(PollFd::new(fd.as_fd(), out_flags));
            }
            let timeout = if stopping.is_some() {
                PollTimeout::from(100u8)
            } else {
                PollTimeout::NONE
            };
            match poller.poll(&mut fds, timeout) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => break Ended::Dropped(format!("poll: {e}")),
            }
            let hit =
                |f: &PollFd<'_>, bits: PollFlags| f.revents().is_some_and(|r| r.intersects(bits));
            let any = PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR;
            let (sock, dev, stop_now) = (hit(&fds[0], any), hit(&fds[1], any), hit(&fds[2], any));
            let out = fds.get(3).is_some_and(|f| hit(f, any));
            drop(fds);
            if stop_now && stopping.is_none() {
                stopping = Some(Instant::now());
                report = read_report(stop);
            }
            if out {
                if let Err(e) = self.forward_output() {
                    break Ended::Dropped(e);
                }
            }
            if dev {
                match self.forward_request() {
                    Ok(true) => {}
                    Ok(false) => break Ended::Unmounted,
                    Err(e) => break Ended::Dropped(e),
                }
            }
            if sock {
                if let Err(e) = self.ch.fill() {
                    break Ended::Dropped(format!("the connection broke: {e}"));
                }
                if let Err(e) = self.deliver_replies() {
                    break Ended::Dropped(e);
                }
                if self.ch.eof() {
                    break Ended::Dropped("the daemon closed the connection".into());
                }
            }
            if let Err(e) = self.ch.flush() {
                break Ended::Dropped(format!("the connection broke: {e}"));
            }
        };
        if ended == Ended::Stopped {
            if let Some(r) = report {
                let _ = self.ch.send(&r);
            }
            let _ = self.ch.flush_all(Duration::from_secs(5));
        }
        self.ch.close();
        if matches!(ended, Ended::Dropped(_)) {
            self.fail_pending();
        }
        let relay = match &ended {
            Ended::Dropped(_) => self.output.take(),
            _ => None,
        };
        // Closes this copy of /dev/fuse (and ends the notification thread, which holds
        // another): the mount fails closed from here on (after a drop, ENOTCONN from
        // `fail_pending`'s thread, which holds the last copy).
        drop(self);
        if let Some(out) = relay {
            relay_locally(&out, stop, stopping, grace);
        }
        ended
    }

    /// The connection dropped: from now on a thread of its own answers ENOTCONN to every
    /// request the kernel sends, first to those forwarded and not answered, until the mount
    /// ends or `attach` exits (docs/PROTOCOL-NOTES.md R42). Were `/dev/fuse` closed instead, the
    /// kernel would end the requests waiting at that moment with ECONNABORTED and only later ones
    /// with ENOTCONN: what a process saw would depend on when its request was read.
    fn fail_pending(&mut self) {
        let unanswered: Vec<u64> = self.inflight.drain().map(|(unique, _)| unique).collect();
        let fail = |dev: &OwnedFd, unique: u64| {
            let _ = write_dev(dev, &wire::out_header(unique, -libc::ENOTCONN, 0));
        };
        let Ok(dev) = self.dev.try_clone() else {
            for unique in unanswered {
                fail(&self.dev, unique);
            }
            return;
        };
        let mut buf = std::mem::take(&mut self.buf);
        let spawned = std::thread::Builder::new()
            .name("smithfs-failed".into())
            .spawn(move || {
                for unique in unanswered {
                    fail(&dev, unique);
                }
                loop {
                    let n = match nix::unistd::read(dev.as_raw_fd(), &mut buf) {
                        Ok(n) if n >= IN_HEADER_LEN => n,
                        Ok(_) => return,
                        Err(
                            nix::errno::Errno::EINTR
                            | nix::errno::Errno::EAGAIN
                            | nix::errno::Errno::ENOENT,
                        ) => continue,
                        // ENODEV: unmounted.
                        Err(_) => return,
                    };
                    let frame = &buf[..n];
                    let op = u32::from_ne_bytes([frame[4], frame[5], frame[6], frame[7]]);
                    let unique = u64::from_ne_bytes(frame[8..16].try_into().unwrap_or([0; 8]));
                    if !matches!(
                        op,
                        opcode::FORGET | opcode::BATCH_FORGET | opcode::INTERRUPT
                    ) {
                        fail(&dev, unique);
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::debug!("cannot start the thread that fails the mount's requests: {e}");
        }
    }

    /// Send one read of COMMAND's output (at most [`oob::MAX_OUTPUT`] bytes); its end of file
    /// ends the output.
    fn forward_output(&mut self) -> Result<(), String> {
        let Some(fd) = &self.output else {
            return Ok(());
        };
        let mut chunk = vec![0u8; oob::MAX_OUTPUT];
        match nix::unistd::read(fd.as_raw_fd(), &mut chunk) {
            Ok(0) => self.output = None,
            Ok(n) => self
                .ch
                .send(&oob::output(&chunk[..n]))
                .map_err(|e| format!("the connection broke: {e}"))?,
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => {}
            Err(e) => {
                tracing::debug!("reading the command's output: {e}");
                self.output = None;
            }
        }
        Ok(())
    }

    /// Read one request from the kernel and forward it; `Ok(false)` when the mount is gone.
    fn forward_request(&mut self) -> Result<bool, String> {
        let n = match nix::unistd::read(self.dev.as_raw_fd(), &mut self.buf) {
            Ok(n) => n,
            // ENOENT: the request was interrupted before we read it.
            Err(
                nix::errno::Errno::EINTR | nix::errno::Errno::EAGAIN | nix::errno::Errno::ENOENT,
            ) => return Ok(true),
            Err(nix::errno::Errno::ENODEV) => return Ok(false),
            Err(e) => return Err(format!("reading /dev/fuse: {e}")),
        };
        let frame = &self.buf[..n];
        if frame.len() < IN_HEADER_LEN {
            return Err("a request shorter than its header from the kernel".into());
        }
        let op = u32::from_ne_bytes([frame[4], frame[5], frame[6], frame[7]]);
        let unique = u64::from_ne_bytes(frame[8..16].try_into().unwrap_or([0; 8]));
        match op {
            // Every request runs to its end on the daemon (notes R41): the kernel gets the reply.
            opcode::INTERRUPT => return Ok(true),
            opcode::FORGET | opcode::BATCH_FORGET => {}
            _ => {
                self.inflight.insert(unique, op);
            }
        }
        if matches!(op, opcode::RELEASE | opcode::RELEASEDIR) {
            self.handles -= 1;
        }
        self.ch
            .send(frame)
            .map_err(|e| format!("the connection broke: {e}"))?;
        Ok(true)
    }

    /// Write every whole frame the daemon sent to the kernel.
    fn deliver_replies(&mut self) -> Result<(), String> {
        loop {
            let head = self.ch.peek();
            if head.len() < OUT_HEADER_LEN {
                return Ok(());
            }
            let len = u32::from_ne_bytes([head[0], head[1], head[2], head[3]]) as usize;
            if !(OUT_HEADER_LEN..=super::conn::MAX_FRAME).contains(&len) {
                return Err(format!("the daemon sent a frame of {len} bytes"));
            }
            let Some(frame) = self.ch.take(len) else {
                return Ok(());
            };
            let error = i32::from_ne_bytes([frame[4], frame[5], frame[6], frame[7]]);
            let unique = u64::from_ne_bytes(frame[8..16].try_into().unwrap_or([0; 8]));
            if unique == 0 {
                let _ = self.notes.send(frame);
                continue;
            }
            {
                let op = self.inflight.remove(&unique);
                if error == 0 && matches!(op, Some(opcode::OPEN | opcode::CREATE | opcode::OPENDIR))
                {
                    self.handles += 1;
                }
            }
            // ENOENT: the kernel no longer waits for it (interrupted): not the mount's end.
            match write_dev(&self.dev, &frame) {
                Ok(_) | Err(nix::errno::Errno::ENOENT) => {}
                Err(nix::errno::Errno::ENODEV) => return Ok(()),
                Err(e) => tracing::debug!(unique, "writing to /dev/fuse: {e}"),
            }
        }
    }
}
