//! User hooks (docs/SPEC.md §5, §8): for a journaled event with configured commands, run each
//! with the event's journal line as JSON on stdin, the placeholders filled, bound as the
//! operator, in its own process group, killed after `hook_timeout_secs`. Each hook lives on a
//! thread of its own, so the scheduler never waits for one; its end is journaled as
//! `hook.exited` (exit code or signal, `timed_out`, or `error`).
//!
//! Every value a smith can influence is also in the hook's environment ([`hook_env`]:
//! `SMITH_EVENT`, `SMITH_FULL_ID`, `SMITH_RUN_ID`, `SMITH_TASK_FILE`, `SMITH_EXIT_CODE`,
//! `SMITH_PATH`), so a shell hook quotes `"$SMITH_TASK_FILE"` instead of splicing a placeholder
//! into `sh -c` text; placeholders are replaced inside one argument and never re-parsed
//! (docs/SPEC.md §5).

use std::collections::BTreeMap;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backing::{self, BackingIno};
use crate::config::HookEvent;
use crate::process::spawn::{Program, User};
use crate::process::wait_pidfd;
use crate::sched::journal::{Event, Journal};
use crate::sched::output::{Pump, Sink};
use crate::sched::runner::{self, BindTo, Launch, Placeholders, RunBinder};

/// At most this many hooks *of one event and one smith* run at once; beyond it a hook is not
/// started and `hook.exited` says so (a storm of `access.denied` must not fork-bomb the
/// machine). The cap is per event and smith (the operator's and the unknown's events count as
/// one smith's), so one smith's storm never keeps the hooks of `result.published` or
/// `run.exited`, nor another smith's hooks of the same event, from running (docs/PROTOCOL-NOTES.md
/// S26, H24).
pub const MAX_LIVE_HOOKS: usize = 32;
/// At most this many hooks run at once in all, whatever their event and smith (beyond it a hook
/// is not started, as above): what bounds the processes many smiths' storms start together.
pub const MAX_LIVE_HOOKS_TOTAL: usize = 256;

/// Whom hooks run as when that is not the daemon (docs/SPEC.md §12, "Programs smithfs runs for
/// others"): the user who mounted, with sudo, a root daemon.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HookUser {
    /// Its uid, gid and supplementary groups.
    pub creds: User,
    /// `HOME`, `USER` and `LOGNAME` from its account (empty without one), over the daemon's.
    pub env: BTreeMap<String, String>,
}

/// Whose hooks a cap counts: an event and a smith's full id (`None`: no smith).
type HookKey = (HookEvent, Option<String>);

/// The configured hooks and what they need to run.
pub struct Hooks {
    hooks: BTreeMap<HookEvent, Vec<Vec<String>>>,
    timeout: Duration,
    binder: Arc<dyn RunBinder>,
    journal: Arc<Journal>,
    /// `.smithfs-state/hooks.log`: the hooks' stdout and stderr.
    log: Option<OwnedFd>,
    /// Drains the hooks' output into `log`, stopped at the store's reserve
    /// (docs/PROTOCOL-NOTES.md L17).
    pump: Pump,
    /// Hooks running now, per event and smith (its full id; `None`: no smith).
    live: parking_lot::Mutex<BTreeMap<HookKey, Arc<AtomicUsize>>>,
    /// Hooks running now in all.
    total: Arc<AtomicUsize>,
    /// Whom they run as; `None`: the daemon's user.
    user: Option<Arc<HookUser>>,
}

impl Hooks {
    /// Hooks from `config.hooks`, killed after `timeout`, run as `user` (`None`: the daemon's);
    /// their output goes to `log` through `pump`.
    pub fn new(
        hooks: BTreeMap<HookEvent, Vec<Vec<String>>>,
        timeout: Duration,
        binder: Arc<dyn RunBinder>,
        journal: Arc<Journal>,
        log: Option<OwnedFd>,
        pump: Pump,
        user: Option<HookUser>,
    ) -> Hooks {
        let live = parking_lot::Mutex::new(BTreeMap::new());
        Hooks {
            hooks,
            timeout,
            binder,
            journal,
            log,
            pump,
            live,
            total: Arc::new(AtomicUsize::new(0)),
            user: user.map(Arc::new),
        }
    }

    /// Replace the configured hooks and their timeout (a reload of config.json): the next event
    /// fires the new ones; hooks running now finish as they were started.
    pub fn set(&mut self, hooks: BTreeMap<HookEvent, Vec<Vec<String>>>, timeout: Duration) {
        // Counters of nothing running are dropped (a running hook holds its own).
        self.live
            .get_mut()
            .retain(|_, n| n.load(Ordering::SeqCst) > 0);
        self.hooks = hooks;
        self.timeout = timeout;
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
        let Some(argvs) = self.hooks.get(&event) else {
            return;
        };
        let live = self
            .live
            .lock()
            .entry((event, ev.smith.as_ref().map(|f| f.to_string())))
            .or_insert_with(|| Arc::new(AtomicUsize::new(0)))
            .clone();
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
            let Some(slot) = HookSlot::take(&live, &self.total) else {
                done.error = Some(format!(
                    "not started: {MAX_LIVE_HOOKS} hooks of {} of this smith (or \
                     {MAX_LIVE_HOOKS_TOTAL} in all) are already running",
                    ev.event
                ));
                let _ = self.journal.append(&done);
                continue;
            };
            let mut env = self
                .user
                .as_ref()
                .map(|u| u.env.clone())
                .unwrap_or_default();
            env.extend(hook_env(ev, ph));
            let job = HookJob {
                env,
                user: self.user.clone(),
                argv,
                input: format!("{line}\n"),
                timeout: self.timeout,
                binder: self.binder.clone(),
                journal: self.journal.clone(),
                log: self.log.as_ref().and_then(|f| f.try_clone().ok()),
                pump: self.pump.clone(),
                slot,
                done,
            };
            let spawned = std::thread::Builder::new()
                .name("smithfs-hook".into())
                .spawn(move || job.run());
            if let Err(e) = spawned {
                let mut done = Event::new("hook.exited", ev.smith.clone());
                done.hook_event = Some(ev.event.clone());
                done.error = Some(format!("cannot start a hook thread: {e}"));
                let _ = self.journal.append(&done);
            }
        }
    }
}

/// The environment a hook of `ev` gets over the daemon's (docs/SPEC.md §5): `SMITH_EVENT` (the
/// event name), `SMITH_FULL_ID` (empty for an event of no smith), `SMITH_RUN_ID`,
/// `SMITH_TASK_FILE` (as `{task_file}`: the smith's newest task, absolute in the mount),
/// `SMITH_EXIT_CODE` (a run's exit code, 128 + N for signal N, else empty) and `SMITH_PATH` (the
/// journal line's mount-relative `path`); each is empty when the event has none. Always all six,
/// so a hook never sees a value left over from the daemon's own environment.
pub fn hook_env(ev: &Event, ph: &Placeholders) -> BTreeMap<String, String> {
    let exit = match (ev.exit_code, ev.signal) {
        (Some(c), _) => c.to_string(),
        (None, Some(sig)) => (128 + sig).to_string(),
        (None, None) => String::new(),
    };
    [
        ("SMITH_EVENT", ev.event.clone()),
        (
            "SMITH_FULL_ID",
            ev.smith.clone().map(String::from).unwrap_or_default(),
        ),
        ("SMITH_RUN_ID", ev.run_id.clone().unwrap_or_default()),
        ("SMITH_TASK_FILE", ph.task_file.clone()),
        ("SMITH_EXIT_CODE", exit),
        ("SMITH_PATH", ev.path.clone().unwrap_or_default()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// One running hook's place under both caps, given back when dropped.
struct HookSlot {
    live: Arc<AtomicUsize>,
    total: Arc<AtomicUsize>,
}

impl HookSlot {
    /// A place among `live` (the event's and smith's, below [`MAX_LIVE_HOOKS`]) and `total`
    /// (below [`MAX_LIVE_HOOKS_TOTAL`]); `None` when either is full.
    fn take(live: &Arc<AtomicUsize>, total: &Arc<AtomicUsize>) -> Option<HookSlot> {
        if live.fetch_add(1, Ordering::SeqCst) >= MAX_LIVE_HOOKS {
            live.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        if total.fetch_add(1, Ordering::SeqCst) >= MAX_LIVE_HOOKS_TOTAL {
            total.fetch_sub(1, Ordering::SeqCst);
            live.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(HookSlot {
            live: live.clone(),
            total: total.clone(),
        })
    }
}

impl Drop for HookSlot {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::SeqCst);
        self.total.fetch_sub(1, Ordering::SeqCst);
    }
}

struct HookJob {
    env: BTreeMap<String, String>,
    user: Option<Arc<HookUser>>,
    argv: Vec<String>,
    input: String,
    timeout: Duration,
    binder: Arc<dyn RunBinder>,
    journal: Arc<Journal>,
    log: Option<OwnedFd>,
    pump: Pump,
    /// Given back once the hook's end is journaled.
    slot: HookSlot,
    done: Event,
}

impl HookJob {
    fn run(mut self) {
        self.execute();
        let _ = self.journal.append(&self.done);
        drop(self.slot);
    }

    fn execute(&mut self) {
        // Through a pipe the pump drains into hooks.log (without a log: /dev/null).
        let output = match self.log.take() {
            Some(log) => {
                let piped = super::output::pipe().and_then(|(r, w)| {
                    let sink = Sink {
                        log_ino: backing::stat(log.as_fd())
                            .map_or(BackingIno(0), |st| BackingIno::of(&st)),
                        log,
                        home: None,
                        run: None,
                        path: format!("{}/hooks.log", crate::tree::layout::STATE_DIR),
                        mask: None,
                    };
                    self.pump.add(r, sink).map(|_| w)
                });
                match piped {
                    Ok(w) => Some(w),
                    Err(e) => {
                        self.done.error = Some(format!("cannot make the hook's output pipe: {e}"));
                        return;
                    }
                }
            }
            None => None,
        };
        let started = runner::launch(
            Launch {
                program: Program {
                    argv: &self.argv,
                    env: &self.env,
                    // Never the daemon's cwd (which may be at or above the mount): `/`.
                    cwd: Some(std::path::Path::new("/")),
                    stdin_piped: true,
                    output,
                    nofile: (0, 0),
                    confine: None,
                    user: self.user.as_deref().map(|u| &u.creds),
                },
                bind: BindTo::Operator,
                // Hooks are the operator's programs: never in a run's sandbox, as the mounting
                // user (docs/SPEC.md §12).
                sandbox: None,
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
        crate::process::reaper::untrack(started.pid);
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
    let Ok(fd) = crate::process::pidfd::open(pid, 0) else {
        return true; // already gone (or no pidfd support): let wait() decide
    };
    wait_pidfd(fd.as_fd(), deadline)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hook_env_has_every_variable() {
        let ph = Placeholders {
            task_file: "/m/smiths/smith-root/inbox/task-1.md".into(),
            ..Placeholders::default()
        };
        let mut ev = Event::new("run.exited", Some(crate::tree::model::FullId::root()));
        ev.run_id = Some("run-0002".into());
        ev.signal = Some(9);
        let env = hook_env(&ev, &ph);
        let get = |k: &str| env.get(k).map(String::as_str);
        assert_eq!(get("SMITH_EVENT"), Some("run.exited"));
        assert_eq!(get("SMITH_FULL_ID"), Some("smith-root"));
        assert_eq!(get("SMITH_RUN_ID"), Some("run-0002"));
        assert_eq!(get("SMITH_EXIT_CODE"), Some("137"));
        assert_eq!(get("SMITH_PATH"), Some(""));
        assert_eq!(
            get("SMITH_TASK_FILE"),
            Some("/m/smiths/smith-root/inbox/task-1.md")
        );
        ev.exit_code = Some(3);
        ev.signal = None;
        assert_eq!(hook_env(&ev, &ph)["SMITH_EXIT_CODE"], "3");
        let mut denied = Event::new("access.denied", None);
        denied.path = Some("smiths/smith-root/private/x".into());
        let env = hook_env(&denied, &Placeholders::default());
        assert_eq!(env["SMITH_FULL_ID"], "");
        assert_eq!(env["SMITH_EXIT_CODE"], "");
        assert_eq!(env["SMITH_PATH"], "smiths/smith-root/private/x");
        assert_eq!(env.len(), 6);
    }
}
