//! `smithfs run` from a terminal, in the sandbox (docs/SPEC.md §12): the bound command gets a
//! pty of its own, never the operator's terminal, so it cannot push input into it (`TIOCSTI`),
//! read what the operator types into another program, or change its settings.
//!
//! [`Terminal::open`] makes the pty when stdin, stdout or stderr is a terminal; each of those
//! three that is one is replaced in the command by the pty's slave (the others — a pipe, a file —
//! stay as they are). The agent becomes the leader of a new session with the slave as its
//! controlling terminal (`crate::process::sandbox::new_session`), so Ctrl-C, Ctrl-\ and the
//! window size reach it through its own line discipline. [`Terminal::relay`] copies, on a thread
//! of its own: the operator's keystrokes (stdin in raw mode, restored at the end) to the master;
//! the master's output to stdout (or stderr, when only stderr is a terminal); and every window
//! size change (`SIGWINCH`) to the master, which signals the command's foreground group.
//! [`Relay::finish`], once the command and its descendants are gone, drains what the command
//! wrote last, stops the thread and restores the terminal. Known limits: Ctrl-Z stops the
//! command inside its pty, not `smithfs run` (there is no job control across the relay), and a
//! `smithfs run` killed by SIGKILL leaves the terminal in raw mode (`stty sane` repairs it).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::thread::JoinHandle;

use rustix::event::{poll, PollFd, PollFlags};
use rustix::pty::OpenptFlags;
use rustix::termios::{self, OptionalActions, Termios};

/// The write end of the `SIGWINCH` self-pipe (-1: none), for the async-signal-safe handler.
static WINCH: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_winch(_sig: libc::c_int) {
    let fd = WINCH.load(Ordering::Relaxed);
    if fd >= 0 {
        // SAFETY: write is async-signal-safe; one byte from a static to our non-blocking pipe
        // (a full pipe already holds a pending change).
        unsafe { libc::write(fd, b"w".as_ptr().cast(), 1) };
    }
}

/// The pty of one `smithfs run`, before the command starts.
pub struct Terminal {
    master: OwnedFd,
    slave: OwnedFd,
    /// Which of stdin, stdout, stderr are terminals (each gets the slave).
    ttys: [bool; 3],
}

/// A running relay; [`Relay::finish`] ends it (also on drop).
pub struct Relay {
    thread: Option<JoinHandle<()>>,
    /// Written once to stop the thread.
    stop: Option<OwnedFd>,
    /// Stdin's settings before raw mode, restored at the end.
    saved: Option<Termios>,
    /// The previous `SIGWINCH` action and the self-pipe's write end.
    winch: Option<(libc::sigaction, OwnedFd)>,
}

fn std_fd(fd: RawFd) -> BorrowedFd<'static> {
    // SAFETY: 0, 1 and 2 stay open for the life of the process (they are only tested and
    // read or written; a closed one is not a terminal).
    unsafe { BorrowedFd::borrow_raw(fd) }
}

impl Terminal {
    /// A new pty when stdin, stdout or stderr is a terminal (`None` otherwise: pipes and files
    /// are passed to the command unchanged). The slave starts with the settings and window size
    /// of the operator's terminal.
    ///
    /// # Errors
    /// Opening the pty (`/dev/ptmx`) or its slave.
    pub fn open() -> io::Result<Option<Terminal>> {
        let ttys = [0, 1, 2].map(|fd| termios::isatty(std_fd(fd)));
        let Some(first) = (0..3).find(|i| ttys[*i]) else {
            return Ok(None);
        };
        let master = rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY)?;
        rustix::pty::grantpt(&master)?;
        rustix::pty::unlockpt(&master)?;
        let slave =
            rustix::pty::ioctl_tiocgptpeer(&master, OpenptFlags::RDWR | OpenptFlags::NOCTTY)?;
        // Both close-on-exec, above stdio (the keeper's child moves the slave onto 0–2).
        let master = rustix::io::fcntl_dupfd_cloexec(&master, 3)?;
        let slave = rustix::io::fcntl_dupfd_cloexec(&slave, 3)?;
        let tty = std_fd(first as RawFd);
        if let Ok(t) = termios::tcgetattr(tty) {
            let _ = termios::tcsetattr(&slave, OptionalActions::Now, &t);
        }
        if let Ok(w) = termios::tcgetwinsize(tty) {
            let _ = termios::tcsetwinsize(&master, w);
        }
        Ok(Some(Terminal {
            master,
            slave,
            ttys,
        }))
    }

    /// Give the slave to the command's uid and gid (mode 0620 stays), so that it can reopen its
    /// own terminal (`/dev/stdin`, `/dev/tty`) as the agents' user.
    ///
    /// # Errors
    /// `fchown`'s.
    pub fn give_to(&self, uid: u32, gid: u32) -> io::Result<()> {
        rustix::fs::fchown(
            &self.slave,
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
        )?;
        Ok(())
    }

    /// `(slave, n)` for each `n` of 0, 1, 2 that is a terminal: what the command's process must
    /// `dup2` before it executes anything.
    pub fn slave_for_stdio(&self) -> Vec<(RawFd, RawFd)> {
        (0..3)
            .filter(|i| self.ttys[*i as usize])
            .map(|i| (self.slave.as_raw_fd(), i))
            .collect()
    }

    /// Start relaying: stdin in raw mode when it is a terminal, the `SIGWINCH` handler, the
    /// thread.
    ///
    /// # Errors
    /// A pipe, `sigaction` or the thread could not be made (the terminal is then as it was).
    pub fn relay(self) -> io::Result<Relay> {
        let (stop_rd, stop_wr) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        let (winch_rd, winch_wr) = rustix::pipe::pipe_with(
            rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK,
        )?;
        let mut relay = Relay {
            thread: None,
            stop: Some(stop_wr),
            saved: None,
            winch: None,
        };
        WINCH.store(winch_wr.as_raw_fd(), Ordering::Relaxed);
        // SAFETY: a zeroed sigaction with our handler, SA_RESTART; the old one is kept.
        let old = unsafe {
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = on_winch as extern "C" fn(libc::c_int) as libc::sighandler_t;
            new.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut new.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGWINCH, &new, &mut old) != 0 {
                WINCH.store(-1, Ordering::Relaxed);
                return Err(io::Error::last_os_error());
            }
            old
        };
        relay.winch = Some((old, winch_wr));
        let input = self.ttys[0];
        if input {
            if let Ok(t) = termios::tcgetattr(std_fd(0)) {
                let mut raw = t.clone();
                raw.make_raw();
                termios::tcsetattr(std_fd(0), OptionalActions::Now, &raw)?;
                relay.saved = Some(t);
            }
        }
        let output: RawFd = if self.ttys[1] || !self.ttys[2] { 1 } else { 2 };
        let size_of: RawFd = (0..3).find(|i| self.ttys[*i as usize]).unwrap_or(0);
        let Terminal { master, slave, .. } = self;
        let thread = std::thread::Builder::new()
            .name("smithfs-pty".into())
            .spawn(move || {
                pump(&master, input, output, size_of, &stop_rd, &winch_rd);
                drop(slave);
            })?;
        relay.thread = Some(thread);
        Ok(relay)
    }
}

impl Relay {
    /// Drain the command's last output, stop the thread, restore the terminal and `SIGWINCH`.
    pub fn finish(mut self) {
        self.end();
    }

    fn end(&mut self) {
        let stop = self.stop.take();
        if let (Some(t), Some(stop)) = (self.thread.take(), stop) {
            let _ = rustix::io::write(&stop, b"s");
            let _ = t.join();
        }
        if let Some(saved) = self.saved.take() {
            let _ = termios::tcsetattr(std_fd(0), OptionalActions::Now, &saved);
        }
        if let Some((old, _pipe)) = self.winch.take() {
            WINCH.store(-1, Ordering::Relaxed);
            // SAFETY: restoring the action sigaction returned for SIGWINCH.
            unsafe { libc::sigaction(libc::SIGWINCH, &old, std::ptr::null_mut()) };
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.end();
    }
}

/// Write all of `buf` to `fd` (a terminal or pipe), giving up on an error.
fn write_all(fd: BorrowedFd<'_>, mut buf: &[u8]) -> bool {
    while !buf.is_empty() {
        match rustix::io::write(fd, buf) {
            Ok(0) => return false,
            Ok(n) => buf = &buf[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => return false,
        }
    }
    true
}

/// The relay's loop: stdin → master (when `input`), master → `output`, window size changes of
/// terminal `size_of` → master, until `stop` is readable; then the master is drained.
fn pump(
    master: &OwnedFd,
    input: bool,
    output: RawFd,
    size_of: RawFd,
    stop: &OwnedFd,
    winch: &OwnedFd,
) {
    let out = std_fd(output);
    let mut stdin_open = input;
    let mut buf = [0u8; 16 * 1024];
    let stdin = std_fd(0);
    loop {
        let mut fds = vec![
            PollFd::new(master, PollFlags::IN),
            PollFd::new(stop, PollFlags::IN),
            PollFd::new(winch, PollFlags::IN),
        ];
        if stdin_open {
            fds.push(PollFd::new(&stdin, PollFlags::IN));
        }
        match poll(&mut fds, None) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => break,
        }
        let ready: Vec<PollFlags> = fds.iter().map(PollFd::revents).collect();
        drop(fds);
        let hit = |i: usize| {
            ready
                .get(i)
                .is_some_and(|r| r.intersects(PollFlags::IN | PollFlags::HUP | PollFlags::ERR))
        };
        if hit(0) {
            match rustix::io::read(master, &mut buf) {
                Ok(n) if n > 0 => {
                    let _ = write_all(out, &buf[..n]);
                }
                Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => {}
                // EIO: no slave left open (not while this process holds one); stop reading.
                _ => break,
            }
        }
        if hit(2) {
            let mut drain = [0u8; 64];
            while matches!(rustix::io::read(winch, &mut drain), Ok(n) if n > 0) {}
            if let Ok(w) = termios::tcgetwinsize(std_fd(size_of)) {
                let _ = termios::tcsetwinsize(master, w);
            }
        }
        if stdin_open && hit(3) {
            match rustix::io::read(stdin, &mut buf) {
                Ok(n) if n > 0 => {
                    if !write_all(master.as_fd(), &buf[..n]) {
                        stdin_open = false;
                    }
                }
                Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => {}
                _ => stdin_open = false,
            }
        }
        if hit(1) {
            break;
        }
    }
    // The command is gone: what it wrote last is in the master's buffer.
    if let Ok(flags) = rustix::fs::fcntl_getfl(master) {
        let _ = rustix::fs::fcntl_setfl(master, flags | rustix::fs::OFlags::NONBLOCK);
    }
    while let Ok(n) = rustix::io::read(master, &mut buf) {
        if n == 0 || !write_all(out, &buf[..n]) {
            break;
        }
    }
}
