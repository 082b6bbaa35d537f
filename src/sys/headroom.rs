//! Whether the CPUs have headroom, measured with hysteresis from the share of CPU time left
//! idle, in one of two ways: every [`Headroom::PERIOD`] from `/proc/stat` ([`Headroom::watch`],
//! for the io_uring queue threads, which run at `SCHED_IDLE` while the CPUs are idle enough:
//! docs/PROTOCOL-NOTES.md U8), or in the probe windows, leaving out this process's own CPU time
//! ([`Headroom::watch_probed`], for the remote mount's threads, which busy-poll before they
//! sleep while the CPUs have headroom: R60, R63). Both for one reason: on idle CPUs, and most
//! in a VM where an idle vCPU halts, handing work to a sleeping thread costs far more than the
//! work.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Headroom from 30 % of the CPU time idle, none below 15 % ([`Headroom::watch`]).
const IDLE_SHARE: (f64, f64) = (0.15, 0.30);
/// Headroom from 50 % of a probe window's CPU time idle, none below 35 %
/// ([`Headroom::watch_probed`]): with one CPU-bound task on two CPUs there is none.
const PROBED_SHARE: (f64, f64) = (0.35, 0.50);

/// The share (0–1) of the CPU time between two readings that was idle; `None` when no time
/// passed.
fn idle_share(a: CpuTimes, b: CpuTimes) -> Option<f64> {
    let total = b.total.saturating_sub(a.total);
    (total > 0).then(|| b.idle.saturating_sub(a.idle) as f64 / total as f64)
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

    /// The next state after an interval whose share `spare` (0–1) of CPU time was idle, from
    /// state `idle`, with `(lose, regain)` thresholds (hysteresis).
    fn next((lose, regain): (f64, f64), idle: bool, spare: f64) -> bool {
        if idle {
            spare >= lose
        } else {
            spare >= regain
        }
    }

    /// Measure the idle share of `/proc/stat` every [`Headroom::PERIOD`] while `hold()` is
    /// true, calling `on_change` with the new state after each change; then (or when
    /// `/proc/stat` cannot be read) the state is "no headroom" again, without a call. For a
    /// thread of its own.
    pub fn watch(&self, hold: impl Fn() -> bool, on_change: impl Fn(bool)) {
        let Some(mut last) = cpu_times() else {
            self.idle.store(false, Ordering::Relaxed);
            return;
        };
        while hold() {
            std::thread::sleep(Self::PERIOD);
            let Some(now) = cpu_times() else {
                if self.idle.swap(false, Ordering::Relaxed) {
                    on_change(false);
                }
                return;
            };
            if let Some(spare) = idle_share(last, now) {
                let idle = Self::next(IDLE_SHARE, self.idle(), spare);
                if idle != self.idle.swap(idle, Ordering::Relaxed) {
                    on_change(idle);
                }
            }
            last = now;
        }
        self.idle.store(false, Ordering::Relaxed);
    }
}

/// The probe windows (docs/PROTOCOL-NOTES.md R63): the first [`PROBE_WINDOW`] of every
/// [`PROBE_PERIOD`] of `CLOCK_MONOTONIC`, the same instants for every process of a host, in which
/// nothing of smithfs busy-polls, so that what the CPUs do then is the rest of the machine's
/// work and the requests', not the pollers' own.
pub const PROBE_PERIOD: Duration = Duration::from_millis(500);
/// See [`PROBE_PERIOD`].
pub const PROBE_WINDOW: Duration = Duration::from_millis(50);
/// The first measurement's length: the system's CPU time is counted in ticks (4 ms at 250 Hz),
/// so shorter is coarser.
const FIRST_PROBE: Duration = Duration::from_millis(40);

/// Nanoseconds of `CLOCK_MONOTONIC` (the clock every process of the host shares).
pub fn monotonic_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec for the kernel (vDSO) to fill.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) } != 0 {
        return 0;
    }
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Is this instant in a probe window (busy polling must wait)?
pub fn in_probe_window() -> bool {
    in_window(monotonic_ns())
}

/// Is `now` (nanoseconds of `CLOCK_MONOTONIC`) in a probe window?
fn in_window(now: u64) -> bool {
    now % PROBE_PERIOD.as_nanos() as u64 <= PROBE_WINDOW.as_nanos() as u64
}

/// Nanoseconds from `now` to `offset` into the next probe period (or into this one, when
/// still ahead).
fn until_phase(now: u64, offset: Duration) -> u64 {
    let period = PROBE_PERIOD.as_nanos() as u64;
    let phase = now % period;
    let target = offset.as_nanos() as u64;
    if phase < target {
        target - phase
    } else {
        period - phase + target
    }
}

/// Sleep until `offset` into the next (or, when still ahead, this) probe period.
fn sleep_until_phase(offset: Duration) {
    std::thread::sleep(Duration::from_nanos(until_phase(monotonic_ns(), offset)));
}

/// Microseconds of CPU time all CPUs spent since boot, less this process's own, with the
/// number of online CPUs: from the root cgroup's `cpu.stat` `usage_usec` (cgroup v2, at
/// /sys/fs/cgroup or /sys/fs/cgroup/unified), else from `/proc/stat` (counted in its clock
/// ticks, 10 ms: coarser); `None` when neither can be read.
fn cpu_usage() -> Option<(u64, u64)> {
    let usage = ["/sys/fs/cgroup/cpu.stat", "/sys/fs/cgroup/unified/cpu.stat"]
        .iter()
        .find_map(|p| parse_usage_usec(&std::fs::read_to_string(p).ok()?))
        .or_else(|| {
            let t = cpu_times()?;
            // SAFETY: sysconf has no preconditions.
            let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).ok()?;
            (hz > 0).then(|| t.total.saturating_sub(t.idle) * 1_000_000 / hz)
        })?;
    // This process's own CPU time is not the rest of the machine's work (its pollers, its
    // start): left out (precise, where the system's usage is counted in ticks).
    let usage = usage.saturating_sub(own_cpu_us());
    // SAFETY: sysconf has no preconditions.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    Some((usage, u64::try_from(cpus).ok().filter(|&n| n > 0)?))
}

/// Microseconds of CPU time this process used (user and system).
fn own_cpu_us() -> u64 {
    // SAFETY: an all-zero rusage is valid; getrusage fills it.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid rusage for the kernel to fill.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0;
    }
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    us(u.ru_utime) + us(u.ru_stime)
}

/// `usage_usec` of a cgroup's `cpu.stat`.
fn parse_usage_usec(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("usage_usec "))?
        .trim()
        .parse()
        .ok()
}

impl Headroom {
    /// Measure the share of CPU time left idle by everything but this process while `hold()`
    /// is true: once at once over 40 ms (this process's pollers wait for the first
    /// result), then in every probe window, where no process of smithfs polls, so that neither
    /// this process's pollers nor another's (the daemon and a loopback `attach` share a host)
    /// count as the machine's work; headroom from 50 % idle, none below 35 %. Then, or
    /// when the usage cannot be read, "no headroom". For a thread of its own.
    pub fn watch_probed(&self, hold: impl Fn() -> bool) {
        let mut first = true;
        while hold() {
            if !first {
                // 2 ms in: a poller checks the window before each try, and tries for 50 µs.
                sleep_until_phase(Duration::from_millis(2));
            }
            let (Some((a, cpus)), t0) = (cpu_usage(), Instant::now()) else {
                break;
            };
            if std::mem::take(&mut first) {
                std::thread::sleep(FIRST_PROBE);
            } else {
                sleep_until_phase(PROBE_WINDOW - Duration::from_millis(1));
            }
            let (Some((b, _)), t1) = (cpu_usage(), Instant::now()) else {
                break;
            };
            let span = t1.duration_since(t0);
            // Longer than a window: this thread was held up, and the pollers were not.
            if span.is_zero() || span > PROBE_WINDOW {
                continue;
            }
            let used = b.saturating_sub(a) as f64 / (span.as_micros() as f64 * cpus as f64);
            let idle = Self::next(PROBED_SHARE, self.idle(), (1.0 - used).clamp(0.0, 1.0));
            self.idle.store(idle, Ordering::Relaxed);
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
    fn usage_of_a_cpu_stat() {
        let text = "usage_usec 2242965360\nuser_usec 1894869868\nsystem_usec 348095492\n";
        assert_eq!(parse_usage_usec(text), Some(2_242_965_360));
        for bad in ["", "user_usec 5\n", "usage_usec x\n", "usage_usec\n"] {
            assert_eq!(parse_usage_usec(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn idle_share_between_two_readings() {
        let t = |total, idle| CpuTimes { total, idle };
        assert_eq!(idle_share(t(100, 50), t(200, 125)), Some(0.75));
        assert_eq!(idle_share(t(100, 50), t(100, 50)), None);
    }

    #[test]
    fn probe_windows_are_the_start_of_each_period() {
        let ms = |m: u64| m * 1_000_000;
        // (now, in a window)
        for (now, inside) in [
            (0, true),
            (ms(50), true),
            (ms(51), false),
            (ms(499), false),
            (ms(500), true),
            (ms(1_000_020), true),
            (ms(1_000_070), false),
        ] {
            assert_eq!(in_window(now), inside, "{now}");
        }
        // (now, offset, wait)
        for (now, offset, wait) in [
            (0, 2, ms(2)),
            (ms(1), 2, ms(1)),
            (ms(2), 2, ms(500)),
            (ms(10), 49, ms(39)),
            (ms(100), 2, ms(402)),
            (ms(499), 2, ms(3)),
        ] {
            assert_eq!(
                until_phase(now, Duration::from_millis(offset)),
                wait,
                "{now} {offset}"
            );
        }
    }

    #[test]
    fn headroom_has_hysteresis() {
        // (thresholds, idle before, idle share, idle after)
        for (t, idle, spare, next) in [
            (IDLE_SHARE, false, 0.9, true),
            (IDLE_SHARE, false, 0.30, true),
            (IDLE_SHARE, false, 0.29, false),
            (IDLE_SHARE, true, 0.15, true),
            (IDLE_SHARE, true, 0.149, false),
            (PROBED_SHARE, false, 0.50, true),
            (PROBED_SHARE, false, 0.49, false),
            (PROBED_SHARE, true, 0.40, true),
            (PROBED_SHARE, true, 0.35, true),
            (PROBED_SHARE, true, 0.34, false),
            (PROBED_SHARE, true, 0.0, false),
        ] {
            assert_eq!(Headroom::next(t, idle, spare), next, "{t:?} {idle} {spare}");
        }
    }

    #[test]
    fn watching_ends_without_headroom() {
        let h = Headroom::new();
        h.idle.store(true, Ordering::Relaxed);
        h.watch(|| false, |_| panic!("no change is measured"));
        assert!(!h.idle());
    }
}
