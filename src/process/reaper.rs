//! Reaping orphans. The daemon is a child subreaper (docs/SPEC.md §2), so the orphans of runs
//! re-parent to it and must be reaped — without stealing the exit status of the processes the
//! daemon started itself (run leaders, hooks), which their own threads wait for.
//!
//! Started processes are tracked from spawn until their owner has waited for them; the reaper
//! thread peeks at zombies (`waitid(WNOWAIT)`) and reaps only untracked ones it has seen twice
//! (the second sighting closes the window between `spawn` returning and `track`).
//!
//! The same thread is the daemon's periodic one: every second it also runs the upkeep
//! registered with [`every_second`] (the identity resolver's sweep of dead processes).

use std::collections::HashSet;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;

fn tracked() -> &'static Mutex<HashSet<u32>> {
    static TRACKED: OnceLock<Mutex<HashSet<u32>>> = OnceLock::new();
    TRACKED.get_or_init(Default::default)
}

/// A process the daemon started and will wait for itself.
pub fn track(pid: u32) {
    tracked().lock().insert(pid);
}

/// Its owner has waited for it.
pub fn untrack(pid: u32) {
    tracked().lock().remove(&pid);
}

/// Periodic upkeep run by the reaper thread.
type Upkeep = Arc<dyn Fn() + Send + Sync>;

fn upkeep() -> &'static Mutex<Vec<Upkeep>> {
    static UPKEEP: OnceLock<Mutex<Vec<Upkeep>>> = OnceLock::new();
    UPKEEP.get_or_init(Default::default)
}

/// Run `f` about once a second on the reaper thread, for the life of the process (once
/// [`start`] was called). `f` must not block for long: reaping waits for it.
pub fn every_second(f: impl Fn() + Send + Sync + 'static) {
    upkeep().lock().push(Arc::new(f));
}

/// Ticks of the reaper loop (200 ms each) between two upkeep rounds.
const UPKEEP_TICKS: u32 = 5;

/// Start the reaper thread (once per process).
pub fn start() {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        let _ = std::thread::Builder::new()
            .name("smithfs-orphans".into())
            .spawn(run);
    });
}

fn run() {
    let mut seen: HashSet<u32> = HashSet::new();
    let mut ticks = 0u32;
    loop {
        std::thread::sleep(Duration::from_millis(200));
        ticks += 1;
        if ticks >= UPKEEP_TICKS {
            ticks = 0;
            // Cloned out, so no lock is held while the upkeep runs.
            let jobs: Vec<Upkeep> = upkeep().lock().clone();
            for job in jobs {
                job();
            }
        }
        let mut now = HashSet::new();
        // Peek at zombie children one by one: reaping the untracked ones lets waitid find the
        // next; a tracked one at the head is left for its owner (at most one pass per tick).
        for _ in 0..256 {
            // SAFETY: an all-zero siginfo_t is a valid out-value.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: valid out-pointer; WNOWAIT leaves the child waitable.
            let r = unsafe {
                libc::waitid(
                    libc::P_ALL,
                    0,
                    &mut info,
                    libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
                )
            };
            // SAFETY: si_pid is valid for a WEXITED report.
            let pid = if r == 0 { unsafe { info.si_pid() } } else { 0 };
            if pid <= 0 {
                break;
            }
            let pid = pid as u32;
            if tracked().lock().contains(&pid) {
                break;
            }
            if !seen.contains(&pid) {
                now.insert(pid);
                break;
            }
            let mut status = 0;
            // SAFETY: reaping exactly this untracked zombie child.
            unsafe { libc::waitpid(pid as i32, &mut status, libc::WNOHANG) };
        }
        seen = now;
    }
}
