//! Busy polling before sleeping, while the CPUs have headroom (docs/PROTOCOL-NOTES.md R60, R63).
//!
//! A remote request crosses three processes: the caller, the node's `attach`, the daemon, and
//! back. Each thread that waits for the next frame in `poll(2)` sleeps, and on idle CPUs (in a
//! VM: a halted vCPU) waking it costs tens of microseconds, on every hop: a GETATTR round trip
//! took 65–75 µs on loopback with idle CPUs against 13–15 µs with busy ones. So the two threads
//! that wait for a connection's next frame (the node's forwarder, the daemon's leader of a
//! connection's pool) poll without sleeping for up to [`BUSY_POLL`], yielding the CPU between
//! tries, before they sleep: the reply, or the next request of a sequential workload, usually
//! comes within it. Only while the CPUs have headroom: where tasks wait for the CPUs, a poller
//! that yielded waits for its turn when its frame comes, while a sleeping thread is woken ahead
//! (two CPU hogs made ungated polling's round trip 5× slower). The headroom is the share of CPU
//! time the rest of the machine leaves idle, measured in probe windows in which no poller of
//! any smithfs process polls ([`crate::sys::headroom::Headroom::watch_probed`]): measured while
//! they poll, the pollers' own spinning would read as the machine being busy (R63).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollTimeout};

use crate::sys::headroom::{in_probe_window, monotonic_ns, Headroom};

/// How long a thread polls without sleeping before it sleeps in `poll(2)`. The next frame of
/// a sequential workload comes within 10–40 µs on loopback; 20 µs was too short for creates
/// (measured: create ×2000 0.78 s against 0.36 s with 50 µs; 200 µs no better than 50).
pub const BUSY_POLL: Duration = Duration::from_micros(50);

/// This process's headroom, followed while a [`BusyPoller`] lives.
static HEADROOM: Headroom = Headroom::new();
/// Busy pollers alive in this process.
static POLLERS: AtomicUsize = AtomicUsize::new(0);
/// A thread follows [`HEADROOM`] now.
static WATCHING: AtomicBool = AtomicBool::new(false);

/// How long the headroom is still followed after the last poller ended (the daemon's next
/// connection then starts with the state measured).
const LINGER: Duration = Duration::from_secs(30);
/// When the last poller was dropped (`CLOCK_MONOTONIC`, nanoseconds; 0: none yet).
static LAST_DROP: AtomicU64 = AtomicU64::new(0);

/// One thread's waits for a connection's next frame. While one lives, and for 30 s after
/// the last one was dropped (`LINGER`), a thread of the process follows the CPUs' headroom.
#[derive(Debug)]
pub struct BusyPoller {
    _private: (),
}

impl Default for BusyPoller {
    fn default() -> BusyPoller {
        BusyPoller::new()
    }
}

impl BusyPoller {
    /// A poller; starts following the headroom if nothing does (without it, or when the thread
    /// cannot start, it never busy-polls).
    pub fn new() -> BusyPoller {
        POLLERS.fetch_add(1, Ordering::SeqCst);
        if !WATCHING.swap(true, Ordering::SeqCst) {
            let started = std::thread::Builder::new()
                .name("smithfs-headroom".into())
                .spawn(|| loop {
                    HEADROOM.watch_probed(|| {
                        POLLERS.load(Ordering::SeqCst) > 0
                            || monotonic_ns().saturating_sub(LAST_DROP.load(Ordering::SeqCst))
                                < LINGER.as_nanos() as u64
                    });
                    WATCHING.store(false, Ordering::SeqCst);
                    // A poller made after the last check and before the store found a watcher
                    // still there: watch again for it.
                    if POLLERS.load(Ordering::SeqCst) == 0 || WATCHING.swap(true, Ordering::SeqCst)
                    {
                        return;
                    }
                });
            if started.is_err() {
                WATCHING.store(false, Ordering::SeqCst);
            }
        }
        BusyPoller { _private: () }
    }

    /// `poll(2)` on `fds` for up to `timeout`, busy-polling first for up to [`BUSY_POLL`] while
    /// the CPUs have headroom. Returns as `poll` does.
    ///
    /// # Errors
    /// `poll`'s.
    pub fn poll(&self, fds: &mut [PollFd<'_>], timeout: PollTimeout) -> nix::Result<i32> {
        let gated = HEADROOM.idle() && !in_probe_window();
        if timeout == PollTimeout::ZERO || !gated {
            return nix::poll::poll(fds, timeout);
        }
        let start = Instant::now();
        loop {
            let n = nix::poll::poll(fds, PollTimeout::ZERO)?;
            if n > 0 {
                return Ok(n);
            }
            if start.elapsed() >= BUSY_POLL || in_probe_window() {
                return nix::poll::poll(fds, timeout);
            }
            std::thread::yield_now();
        }
    }
}

impl Drop for BusyPoller {
    fn drop(&mut self) {
        LAST_DROP.store(monotonic_ns(), Ordering::SeqCst);
        POLLERS.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_ready_descriptor_is_seen_and_a_quiet_one_waits_out_its_timeout() {
        let p = BusyPoller::new();
        let (r, w) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut fds = [PollFd::new(r.as_fd(), nix::poll::PollFlags::POLLIN)];
        assert_eq!(p.poll(&mut fds, PollTimeout::from(10u8)).unwrap(), 0);
        std::io::Write::write_all(&mut &w, b"x").unwrap();
        let mut fds = [PollFd::new(r.as_fd(), nix::poll::PollFlags::POLLIN)];
        assert_eq!(p.poll(&mut fds, PollTimeout::NONE).unwrap(), 1);
    }
}
