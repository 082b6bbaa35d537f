//! User hooks (PROTOCOL.md §5, §8): for a journaled event with configured commands, run each
//! with the event's journal line as JSON on stdin, the placeholders filled, bound as the
//! operator, in its own process group, killed after `hook_timeout_secs`. Each hook lives on a
//! thread of its own, so the scheduler never waits for one; its end is journaled as
//! `hook.exited` (exit code or signal, `timed_out`, or `error`).

use std::collections::BTreeMap;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::HookEvent;
use crate::sched::journal::{Event, Journal};
use crate::sched::runner::{self, BindTo, Launch, Placeholders, RunBinder};

/// At most this many hooks *of one event* run at once; beyond it a hook is not started and
/// `hook.exited` says so (a storm of `access.denied` must not fork-bomb the machine). The cap is
/// per event, so such a storm never keeps the hooks of `result.published` or `run.exited` from
/// running (docs/PROTOCOL-NOTES.md, part S).
pub const MAX_LIVE_HOOKS: usize = 32;

/// The configured hooks and what they need to run.
pub struct Hooks {
    hooks: BTreeMap<HookEvent, Vec<Vec<String>>>,
    timeout: Duration,
    binder: Arc<dyn RunBinder>,
    journal: Arc<Journal>,
    /// `.smithfs-state/hooks.log`: the hooks' stdout and stderr.
    log: Option<OwnedFd>,
    /// Hooks running now, per event.
    live: BTreeMap<HookEvent, Arc<AtomicUsize>>,
}

impl Hooks {
    /// Hooks from `config.hooks`, killed after `timeout`; their output goes to `log`.
    pub fn new(
        hooks: BTreeMap<HookEvent, Vec<Vec<String>>>,
        timeout: Duration,
        binder: Arc<dyn RunBinder>,
        journal: Arc<Journal>,
        log: Option<OwnedFd>,
    ) -> Hooks {
        let live = hooks
            .keys()
            .map(|e| (*e, Arc::new(AtomicUsize::new(0))))
            .collect();
        Hooks {
            hooks,
            timeout,
            binder,
            journal,
            log,
            live,
        }
    }

    /// Are any hooks configured for `event`?
    pub fn wants(&self, event: &str) -> bool {
        event
            .parse::<HookEvent>()
            .ok()
            .and_then(|e| self.hooks.get(&e))
            .is_some_and(|v| !v.is_empty())
    }

    /// Start every hook configured for `ev` (whose journal line is `line`), without waiting.
    pub fn fire(&self, ev: &Event, line: &str, ph: &Placeholders) {
        let Ok(event) = ev.event.parse::<HookEvent>() else {
            return;
        };
        let (Some(argvs), Some(live)) = (self.hooks.get(&event), self.live.get(&event)) else {
            return;
        };
        for argv in argvs {
            let mut done = Event::new("hook.exited", ev.smith.clone());
            done.hook_event = Some(ev.event.clone());
            done.hook = Some(argv.clone());
            let argv = match ph.expand_argv(argv) {
                Ok(a) => a,
                Err(e) => {
                    done.error = Some(e);
                    let _ = self.journal.append(&done);
                    continue;
                }
            };
            if live.fetch_add(1, Ordering::SeqCst) >= MAX_LIVE_HOOKS {
                live.fetch_sub(1, Ordering::SeqCst);
                done.error = Some(format!(
                    "not started: {MAX_LIVE_HOOKS} hooks of {} are already running",
                    ev.event
                ));
                let _ = self.journal.append(&done);
                continue;
            }
            let job = HookJob {
                argv,
                input: format!("{line}\n"),
                timeout: self.timeout,
                binder: self.binder.clone(),
                journal: self.journal.clone(),
                log: self.log.as_ref().and_then(|f| f.try_clone().ok()),
                live: live.clone(),
                done,
            };
            let spawned = std::thread::Builder::new()
                .name("smithfs-hook".into())
                .spawn(move || job.run());
            if let Err(e) = spawned {
                live.fetch_sub(1, Ordering::SeqCst);
                let mut done = Event::new("hook.exited", ev.smith.clone());
                done.hook_event = Some(ev.event.clone());
                done.error = Some(format!("cannot start a hook thread: {e}"));
                let _ = self.journal.append(&done);
            }
        }
    }
}

struct HookJob {
    argv: Vec<String>,
    input: String,
    timeout: Duration,
    binder: Arc<dyn RunBinder>,
    journal: Arc<Journal>,
    log: Option<OwnedFd>,
    live: Arc<AtomicUsize>,
    done: Event,
}

impl HookJob {
    fn run(mut self) {
        self.execute();
        let _ = self.journal.append(&self.done);
        self.live.fetch_sub(1, Ordering::SeqCst);
    }

    fn execute(&mut self) {
        let env = BTreeMap::new();
        let started = runner::launch(
            Launch {
                argv: &self.argv,
                env: &env,
                // Never the daemon's cwd (which may be at or above the mount): `/`.
                cwd: Some(std::path::Path::new("/")),
                stdin_piped: true,
                output: self.log.take(),
                bind: BindTo::Operator,
                nofile: (0, 0),
            },
            &*self.binder,
        );
        let mut started = match started {
            Ok(s) => s,
            Err(e) => {
                self.done.error = Some(format!("cannot start `{}`: {e}", self.argv[0]));
                return;
            }
        };
        self.done.pid = Some(started.pid);
        if let Some(mut stdin) = started.child.stdin.take() {
            // A hook that does not read its stdin gets EPIPE here or a full pipe: ignored.
            let _ = stdin.write_all(self.input.as_bytes());
        }
        let deadline = Instant::now() + self.timeout;
        let exited = match started.child.pidfd() {
            Some(fd) => wait_pidfd(fd, deadline),
            None => wait_exit(started.pid, deadline),
        };
        if !exited {
            // SAFETY: signalling the hook's own process group (it called setsid).
            unsafe { libc::kill(-(started.pid as i32), libc::SIGKILL) };
            self.done.timed_out = Some(true);
        }
        let waited = started.child.wait();
        super::reaper::untrack(started.pid);
        match waited {
            Ok(st) => {
                self.done.exit_code = st.code();
                self.done.signal = st.signal();
            }
            Err(e) => self.done.error = Some(format!("wait: {e}")),
        }
    }
}

/// Wait until process `pid` (our child) exits or `deadline` passes, without reaping it.
/// Returns true if it exited.
pub fn wait_exit(pid: u32, deadline: Instant) -> bool {
    // Our child: its pid cannot be recycled before we reap it.
    let Ok(fd) = crate::identity::pidfd::open(pid, 0) else {
        return true; // already gone (or no pidfd support): let wait() decide
    };
    wait_pidfd(fd.as_fd(), deadline)
}

/// Wait until the process of pidfd `fd` exits or `deadline` passes, without reaping it.
/// Returns true if it exited.
pub fn wait_pidfd(fd: BorrowedFd<'_>, deadline: Instant) -> bool {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        if n > 0 {
            return true;
        }
    }
}
