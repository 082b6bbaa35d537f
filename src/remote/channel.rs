//! A TLS channel over a non-blocking TCP socket, driven by `poll(2)` (docs/SPEC.md §13): the
//! one piece of I/O both ends of a remote connection share. Frames in both directions start
//! with their own length as a native-endian `u32` (`fuse_in_header.len`,
//! `fuse_out_header.len`), so the channel needs no framing of its own.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout};

/// Plaintext bytes read from the TLS layer per call.
const READ_CHUNK: usize = 64 * 1024;
/// [`Channel::fill`] stops reading the socket once this much plaintext is buffered: a peer
/// that floods fills the socket's buffers, not the daemon's memory (docs/PROTOCOL-NOTES.md R7).
pub const FILL_LIMIT: usize = 4 << 20;

/// One end of a TLS connection.
pub struct Channel {
    sock: TcpStream,
    tls: rustls::Connection,
    /// Plaintext received: `inbuf[head..]` is not yet taken.
    inbuf: Vec<u8>,
    /// Where the bytes not yet taken start in `inbuf` (taking a frame moves it on instead of
    /// moving what follows: a buffer of many small frames is not copied once per frame).
    head: usize,
    /// The peer closed (TCP EOF or TLS close_notify).
    eof: bool,
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel")
            .field("buffered", &self.buffered())
            .field("eof", &self.eof)
            .finish_non_exhaustive()
    }
}

/// What [`Channel::wait`] saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ready {
    /// The socket has something to read (or hung up).
    pub socket: bool,
    /// The extra descriptor is readable.
    pub extra: bool,
}

impl Channel {
    /// A channel over `sock` (made non-blocking) speaking `tls`. Outgoing plaintext is not
    /// limited by `rustls`: callers bound it themselves (the listener: one reply per serving
    /// thread, each flushed before the thread takes another request).
    ///
    /// # Errors
    /// The socket could not be made non-blocking.
    pub fn new(sock: TcpStream, mut tls: rustls::Connection) -> io::Result<Channel> {
        sock.set_nonblocking(true)?;
        let _ = sock.set_nodelay(true);
        tls.set_buffer_limit(None);
        Ok(Channel {
            sock,
            tls,
            inbuf: Vec::new(),
            head: 0,
            eof: false,
        })
    }

    /// The peer closed.
    pub fn eof(&self) -> bool {
        self.eof
    }

    /// Plaintext bytes received and not yet taken.
    pub fn buffered(&self) -> usize {
        self.inbuf.len() - self.head
    }

    /// Output is waiting to be sent.
    pub fn wants_write(&self) -> bool {
        self.tls.wants_write()
    }

    /// Wait up to `timeout` (`None`: forever) until the socket can be read (when `read`), or
    /// written (when output waits), or `extra` is readable.
    ///
    /// # Errors
    /// `poll` failed.
    pub fn wait(
        &self,
        read: bool,
        extra: Option<std::os::fd::BorrowedFd<'_>>,
        timeout: Option<Duration>,
    ) -> io::Result<Ready> {
        let mut want = PollFlags::empty();
        if read {
            want |= PollFlags::POLLIN;
        }
        if self.tls.wants_write() {
            want |= PollFlags::POLLOUT;
        }
        let mut fds = vec![PollFd::new(self.sock.as_fd(), want)];
        if let Some(e) = extra {
            fds.push(PollFd::new(e, PollFlags::POLLIN));
        }
        let t = match timeout {
            None => PollTimeout::NONE,
            Some(d) => PollTimeout::try_from(d.as_millis().min(i32::MAX as u128) as i32)
                .unwrap_or(PollTimeout::MAX),
        };
        match nix::poll::poll(&mut fds, t) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
        let hit = |f: &PollFd<'_>| {
            f.revents().is_some_and(|r| {
                r.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR)
            })
        };
        Ok(Ready {
            socket: hit(&fds[0]),
            extra: fds.get(1).is_some_and(hit),
        })
    }

    /// Read what the socket has (without blocking) and decrypt it into the plaintext buffer.
    ///
    /// # Errors
    /// A socket error or a TLS error (the connection is then unusable; the TLS alert, if any,
    /// is queued for [`Channel::flush`]).
    pub fn fill(&mut self) -> io::Result<()> {
        while self.buffered() < FILL_LIMIT {
            let mut sock = Reading {
                sock: &self.sock,
                short: false,
            };
            let drained = match self.tls.read_tls(&mut sock) {
                Ok(0) => {
                    self.eof = true;
                    break;
                }
                // A read shorter than asked for took all the socket had: no second read (a
                // syscall that would only say EAGAIN) until the next wait.
                Ok(_) => sock.short,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            let state = self
                .tls
                .process_new_packets()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            if state.plaintext_bytes_to_read() > 0 {
                self.drain_plaintext(state.plaintext_bytes_to_read())?;
            }
            if state.peer_has_closed() {
                self.eof = true;
                break;
            }
            if drained {
                break;
            }
        }
        self.drain_plaintext(0)
    }

    /// Take the decrypted plaintext into the buffer, `hint` bytes expected (0: only to see
    /// whether the peer closed).
    fn drain_plaintext(&mut self, hint: usize) -> io::Result<()> {
        // Straight into the buffer's spare room, sized to what is there: no bounce through a
        // chunk on the stack, no 64 KiB zeroed for a 100-byte frame.
        let mut room = hint.clamp(64, READ_CHUNK);
        let mut left = hint;
        loop {
            let start = self.inbuf.len();
            self.inbuf.resize(start + room, 0);
            room = READ_CHUNK;
            let r = self.tls.reader().read(&mut self.inbuf[start..]);
            let n = *r.as_ref().unwrap_or(&0);
            self.inbuf.truncate(start + n);
            match r {
                Ok(0) => {
                    self.eof = true;
                    return Ok(());
                }
                Ok(n) if hint > 0 && n >= left => return Ok(()),
                Ok(n) => left = left.saturating_sub(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }

    /// The first `n` buffered bytes, if that many are buffered, removed from the buffer.
    pub fn take(&mut self, n: usize) -> Option<Vec<u8>> {
        if self.buffered() < n {
            return None;
        }
        if self.head == 0 && self.inbuf.len() == n {
            // The common case (one frame buffered): the buffer itself, no copy.
            return Some(std::mem::take(&mut self.inbuf));
        }
        let out = self.inbuf[self.head..self.head + n].to_vec();
        self.head += n;
        if self.head == self.inbuf.len() {
            self.inbuf.clear();
            self.head = 0;
        } else if self.head >= READ_CHUNK && self.head * 2 >= self.inbuf.len() {
            // Give back the room taken once it is most of the buffer.
            self.inbuf.drain(..self.head);
            self.head = 0;
        }
        Some(out)
    }

    /// The buffered bytes (not removed).
    pub fn peek(&self) -> &[u8] {
        &self.inbuf[self.head..]
    }

    /// Queue `bytes` for sending.
    ///
    /// # Errors
    /// The TLS layer refused (the connection is closing).
    pub fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.tls.writer().write_all(bytes)
    }

    /// Send what is queued, without blocking; `true` when nothing is left.
    ///
    /// # Errors
    /// A socket error.
    pub fn flush(&mut self) -> io::Result<bool> {
        while self.tls.wants_write() {
            match self.tls.write_tls(&mut self.sock) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Send everything queued, waiting for the socket as long as `timeout` allows.
    ///
    /// # Errors
    /// A socket error, or [`io::ErrorKind::TimedOut`].
    pub fn flush_all(&mut self, timeout: Duration) -> io::Result<()> {
        let deadline = std::time::Instant::now() + timeout;
        while !self.flush()? {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(io::ErrorKind::TimedOut.into());
            }
            self.wait(false, None, Some(left))?;
        }
        Ok(())
    }

    /// Finish the TLS handshake, waiting up to `timeout`.
    ///
    /// # Errors
    /// A socket or TLS error, the peer closed, or [`io::ErrorKind::TimedOut`].
    pub fn handshake(&mut self, timeout: Duration) -> io::Result<()> {
        let deadline = std::time::Instant::now() + timeout;
        while self.tls.is_handshaking() {
            self.pump(deadline)?;
            if self.eof && self.tls.is_handshaking() {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
        self.flush_all(timeout)
    }

    /// Wait until `n` bytes are buffered (or `timeout` passes) and take them.
    ///
    /// # Errors
    /// A socket or TLS error, the peer closed first, or [`io::ErrorKind::TimedOut`].
    pub fn read_exact(&mut self, n: usize, timeout: Duration) -> io::Result<Vec<u8>> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(b) = self.take(n) {
                return Ok(b);
            }
            if self.eof {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            self.pump(deadline)?;
        }
    }

    /// One step of a wait for the peer: send what is pending, wait until the socket is
    /// readable (or `deadline`), and take in what arrived.
    ///
    /// # Errors
    /// A socket or TLS error, or [`io::ErrorKind::TimedOut`] once `deadline` has passed.
    fn pump(&mut self, deadline: std::time::Instant) -> io::Result<()> {
        self.flush()?;
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        self.wait(true, None, Some(left))?;
        self.fill()
    }

    /// The underlying socket (to clone for a shutdown from another thread).
    pub fn socket(&self) -> &TcpStream {
        &self.sock
    }

    /// Send a TLS close_notify and whatever is queued (best effort, bounded wait).
    pub fn close(&mut self) {
        self.tls.send_close_notify();
        let _ = self.flush_all(Duration::from_millis(200));
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }
}

/// The socket as `rustls` reads it, noting a read shorter than asked for.
struct Reading<'a> {
    sock: &'a TcpStream,
    short: bool,
}

impl Read for Reading<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.sock.read(buf)?;
        self.short = n < buf.len();
        Ok(n)
    }
}
