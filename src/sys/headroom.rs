//! Whether the CPUs have headroom, measured every [`Headroom::PERIOD`] with hysteresis, from one
//! of two [`Signal`]s: the share of CPU time left idle (`/proc/stat`), or the share of time no
//! task waited for a CPU (`/proc/pressure/cpu`, PSI). The io_uring queue threads run at
//! `SCHED_IDLE` while the CPUs are idle enough (docs/PROTOCOL-NOTES.md U8); the remote mount's
//! threads busy-poll before they sleep while nothing waits for a CPU (R60). Both for one reason:
//! on idle CPUs, and most in a VM where an idle vCPU halts, handing work to a sleeping thread
//! costs far more than the work.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// What "headroom" is measured from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// The share of CPU time left idle (idle + iowait of `/proc/stat`'s `cpu` line): headroom
    /// from 30 % idle, none below 15 %. Busy-polling threads would count as busy here.
    IdleShare,
    /// The share of time in which no task waited for a CPU (`some` of `/proc/pressure/cpu`):
    /// headroom while tasks waited less than 10 % of the time, none from 25 %. Pollers that
    /// yield count only when they and the threads they serve outnumber the CPUs.
    Pressure,
}

impl Signal {
    /// (share below which the headroom is lost, share from which it is regained).
    fn thresholds(self) -> (f64, f64) {
        match self {
            Signal::IdleShare => (0.15, 0.30),
            Signal::Pressure => (0.75, 0.90),
        }
    }

    fn read(self) -> Option<Reading> {
        match self {
            Signal::IdleShare => cpu_times().map(Reading::Times),
            Signal::Pressure => {
                let text = std::fs::read_to_string("/proc/pressure/cpu").ok()?;
                Some(Reading::Stalled(
                    Instant::now(),
                    parse_pressure_some(&text)?,
                ))
            }
        }
    }
}

/// One reading of a [`Signal`].
#[derive(Debug, Clone, Copy)]
enum Reading {
    Times(CpuTimes),
    /// When, and the microseconds in which some task waited for a CPU, since boot.
    Stalled(Instant, u64),
}

impl Reading {
    /// The share (0–1) of the time between `self` and the later `now` that had headroom;
    /// `None` when nothing can be said (no time passed, or two kinds).
    fn spare_until(self, now: Reading) -> Option<f64> {
        match (self, now) {
            (Reading::Times(a), Reading::Times(b)) => {
                let total = b.total.saturating_sub(a.total);
                (total > 0).then(|| b.idle.saturating_sub(a.idle) as f64 / total as f64)
            }
            (Reading::Stalled(t0, a), Reading::Stalled(t1, b)) => {
                let us = t1.duration_since(t0).as_micros() as f64;
                (us > 0.0).then(|| (1.0 - b.saturating_sub(a) as f64 / us).clamp(0.0, 1.0))
            }
            _ => None,
        }
    }
}

/// Whether the CPUs have headroom, as last measured by [`Headroom::watch`] (false until then,
/// and after it ends).
#[derive(Debug)]
pub struct Headroom {
    idle: AtomicBool,
}

impl Default for Headroom {
    fn default() -> Headroom {
        Headroom::new()
    }
}

impl Headroom {
    /// Interval between two readings.
    pub const PERIOD: Duration = Duration::from_millis(200);

    /// No headroom, until measured.
    pub const fn new() -> Headroom {
        Headroom {
            idle: AtomicBool::new(false),
        }
    }

    /// Do the CPUs have headroom now?
    pub fn idle(&self) -> bool {
        self.idle.load(Ordering::Relaxed)
    }

    /// The next state after an interval whose share `spare` (0–1) had headroom by `signal`,
    /// from state `idle` (hysteresis between the signal's two thresholds).
    fn next(signal: Signal, idle: bool, spare: f64) -> bool {
        let (busy, calm) = signal.thresholds();
        if idle {
            spare >= busy
        } else {
            spare >= calm
        }
    }

    /// Measure `signal` every [`Headroom::PERIOD`] while `hold()` is true, calling `on_change`
    /// with the new state after each change; then (or when the signal cannot be read) the
    /// state is "no headroom" again, without a call. For a thread of its own.
    pub fn watch(&self, signal: Signal, hold: impl Fn() -> bool, on_change: impl Fn(bool)) {
        let Some(mut last) = signal.read() else {
            self.idle.store(false, Ordering::Relaxed);
            return;
        };
        while hold() {
            std::thread::sleep(Self::PERIOD);
            let Some(now) = signal.read() else {
                if self.idle.swap(false, Ordering::Relaxed) {
                    on_change(false);
                }
                return;
            };
            if let Some(spare) = last.spare_until(now) {
                let idle = Self::next(signal, self.idle(), spare);
                if idle != self.idle.swap(idle, Ordering::Relaxed) {
                    on_change(idle);
                }
            }
            last = now;
        }
        self.idle.store(false, Ordering::Relaxed);
    }
}

/// Run thread `tid` (0: the calling one) at `SCHED_IDLE` (`idle`) or `SCHED_OTHER`; false when
/// refused (or the thread is gone).
pub fn set_policy_of(tid: libc::pid_t, idle: bool) -> bool {
    let policy = if idle {
        libc::SCHED_IDLE
    } else {
        libc::SCHED_OTHER
    };
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `tid` is a thread id (0: the calling thread); `param` is a valid sched_param for
    // both policies.
    unsafe { libc::sched_setscheduler(tid, policy, &param) == 0 }
}

/// Jiffies of all CPUs since boot: in total, and idle (idle + iowait).
#[derive(Debug, Clone, Copy, PartialEq)]
struct CpuTimes {
    total: u64,
    idle: u64,
}

fn cpu_times() -> Option<CpuTimes> {
    parse_cpu_times(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// The aggregate `cpu` line of `/proc/stat` (`cpu  user nice system idle iowait irq softirq
/// steal guest guest_nice`; guest time is already in user and nice).
fn parse_cpu_times(text: &str) -> Option<CpuTimes> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().ok())
        .collect::<Option<_>>()?;
    if f.len() < 5 {
        return None;
    }
    let total = f.iter().take(8).sum();
    Some(CpuTimes {
        total,
        idle: f[3] + f[4],
    })
}

/// The `total` (microseconds) of the `some` line of `/proc/pressure/cpu`
/// (`some avg10=0.00 avg60=0.00 avg300=0.00 total=12345`).
fn parse_pressure_some(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("some "))?;
    line.split_whitespace()
        .find_map(|f| f.strip_prefix("total="))?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_times_of_the_aggregate_line() {
        let text = "cpu  100 5 50 800 20 3 2 10 0 0\ncpu0 50 2 25 400 10 1 1 5 0 0\n";
        assert_eq!(
            parse_cpu_times(text),
            Some(CpuTimes {
                total: 990,
                idle: 820
            })
        );
        for bad in ["", "cpu0 1 2 3 4 5\n", "cpu  1 2 3\n", "cpu  1 x 3 4 5\n"] {
            assert_eq!(parse_cpu_times(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn pressure_of_the_some_line() {
        let text = "some avg10=1.50 avg60=0.20 avg300=0.00 total=4242\n\
                    full avg10=0.00 avg60=0.00 avg300=0.00 total=7\n";
        assert_eq!(parse_pressure_some(text), Some(4242));
        for bad in ["", "full total=3\n", "some avg10=1.0\n", "some total=x\n"] {
            assert_eq!(parse_pressure_some(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn spare_share_between_two_readings() {
        let t = |total, idle| Reading::Times(CpuTimes { total, idle });
        assert_eq!(t(100, 50).spare_until(t(200, 125)), Some(0.75));
        assert_eq!(t(100, 50).spare_until(t(100, 50)), None);
        let t0 = Instant::now();
        let p = |ms: u64, us| Reading::Stalled(t0 + Duration::from_millis(ms), us);
        assert_eq!(p(0, 1000).spare_until(p(200, 51_000)), Some(0.75));
        assert_eq!(p(0, 0).spare_until(p(100, 500_000)), Some(0.0));
        assert_eq!(p(0, 0).spare_until(t(1, 1)), None);
    }

    #[test]
    fn headroom_has_hysteresis() {
        // (signal, idle before, share with headroom, idle after)
        use Signal::{IdleShare, Pressure};
        for (signal, idle, spare, next) in [
            (IdleShare, false, 0.9, true),
            (IdleShare, false, 0.30, true),
            (IdleShare, false, 0.29, false),
            (IdleShare, false, 0.0, false),
            (IdleShare, true, 0.29, true),
            (IdleShare, true, 0.15, true),
            (IdleShare, true, 0.149, false),
            (IdleShare, true, 0.0, false),
            (Pressure, false, 1.0, true),
            (Pressure, false, 0.90, true),
            (Pressure, false, 0.89, false),
            (Pressure, true, 0.80, true),
            (Pressure, true, 0.75, true),
            (Pressure, true, 0.74, false),
        ] {
            assert_eq!(
                Headroom::next(signal, idle, spare),
                next,
                "{signal:?} {idle} {spare}"
            );
        }
    }

    #[test]
    fn watching_ends_without_headroom() {
        let h = Headroom::new();
        h.idle.store(true, Ordering::Relaxed);
        h.watch(
            Signal::IdleShare,
            || false,
            |_| panic!("no change is measured"),
        );
        assert!(!h.idle());
    }
}
