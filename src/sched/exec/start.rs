//! Starting runs (docs/SPEC.md §5): what [`Queue::next`](super::Queue::next) names gets a run
//! directory, its effective config, its argv and environment, an output pipe, then a process
//! (the mount's [`launch::Launcher`]). A start that fails at any step takes one path,
//! [`Exec::fail_start`]: the reason into its `messages.log`, `meta.json` and the journal, and
//! the end-of-run rule applied as for a failed run.

use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use super::launch::{self, RunSpec, Submitted};
use super::writes::run_home;
use super::{Exec, Live};
use crate::backing;
use crate::config::{AgentConfig, SmithConfig};
use crate::sched::journal::LastRun;
use crate::sched::output::{self, Sink, StreamId};
use crate::sched::queue::{RunEnd, Wake};
use crate::sched::runner::{self, Meta, RunDir};
use crate::sched::{store_facts, time};
use crate::tree::model::SmithIdx;
use crate::tree::registry::SmithInfo;

/// How long a job may wait in Slurm's queue as far as the scheduler's own clock goes: without
/// bound (a year); the run's time starts when it runs (docs/SPEC.md §13).
const QUEUE_WAIT_UNBOUNDED: Duration = Duration::from_secs(365 * 24 * 3600);

/// One attempt to start a run, as far as it got: the run id and the
/// retries of the config it got to (the mount-wide one until the smith's is read).
struct Attempt {
    run_id: String,
    retries: u32,
}

/// Why a start failed: `run.exited`'s `reason` (`spawn_error`, `bad_config`) and one sentence.
struct Failure {
    reason: &'static str,
    error: String,
}

/// The largest `config.json` of a smith the scheduler reads, in bytes (notes XT22): one holds
/// an agent's command, environment and three numbers.
const SMITH_CONFIG_MAX: u64 = 1 << 20;

impl Failure {
    fn spawn(error: String) -> Failure {
        Failure {
            reason: "spawn_error",
            error,
        }
    }

    fn config(error: String) -> Failure {
        Failure {
            reason: "bad_config",
            error,
        }
    }
}

/// A run whose process started, for [`Exec::track`].
struct Begun {
    command: Vec<String>,
    agent: AgentConfig,
    stream: StreamId,
    oom_base: Option<u64>,
    /// When the spawn began (the time before it is the preparation's).
    spawning: Instant,
    started: Submitted,
}

impl Exec {
    /// Start what the model says may start now (nothing while shutting down or with no agent).
    pub(super) fn dispatch(&mut self) {
        if self.st.shutting_down || self.st.config.agent.command.is_none() {
            return;
        }
        while let Some(s) = self.st.queue.next() {
            let Some(wake) = self.st.queue.start(s) else {
                break;
            };
            self.start_run(s, wake);
        }
    }

    /// Start a run of `s` woken by `wake`: make its directory, prepare it ([`RunSpec`]), start
    /// its process ([`launch::Launcher::submit`]) and follow it; or fail the attempt, on one path.
    fn start_run(&mut self, s: SmithIdx, wake: Wake) {
        let Some(info) = self.env.registry.get(s) else {
            self.st.queue.remove(s);
            return;
        };
        let began = Instant::now();
        let t0 = self.consume_tasks(s);
        let mut attempt = Attempt {
            run_id: String::new(),
            retries: self.st.config.agent.retries,
        };
        let rel = info.rel_dir();
        let begun = match self.make_run_dir(s, &rel, &mut attempt) {
            Err(failure) => Err((failure, None)),
            Ok(dir) => match self.begin(&info, wake, &dir, &mut attempt) {
                Ok(begun) => Ok((dir, begun)),
                Err(failure) => Err((failure, Some(dir))),
            },
        };
        match begun {
            Ok((dir, begun)) => {
                if let Submitted::Process(started) = &begun.started {
                    tracing::debug!(
                        smith = %info.full_id,
                        run = %attempt.run_id,
                        pid = started.pid,
                        in_cgroup = started.child.in_cgroup,
                        prepare_us = (begun.spawning - began).as_micros() as u64,
                        spawn_us = begun.spawning.elapsed().as_micros() as u64,
                        "run started (prepare: run dir, config, placeholders; spawn: clone to exec)"
                    );
                }
                self.track(s, wake, t0, attempt.run_id, dir, begun);
            }
            Err((failure, dir)) => self.fail_start(s, wake, attempt, dir, failure),
        }
    }

    /// The attempt consumes the tasks that are there now, even if it cannot start: a rescan
    /// must not schedule them again. Returns the attempt's start time.
    fn consume_tasks(&mut self, s: SmithIdx) -> SystemTime {
        let rec = self.st.recs.entry(s).or_default();
        rec.next_run = rec.next_run.max(1);
        let t0 = SystemTime::now();
        rec.last_start = Some(t0);
        t0
    }

    /// Everything a run needs before its process — the smith's effective config, argv,
    /// environment, output pipe — then the process ([`launch::Launcher::submit`]).
    fn begin(
        &mut self,
        info: &SmithInfo,
        wake: Wake,
        dir: &RunDir,
        attempt: &mut Attempt,
    ) -> Result<Begun, Failure> {
        let s = info.idx;
        let rel = info.rel_dir();
        let agent = self.smith_agent(&rel).map_err(Failure::config)?;
        attempt.retries = agent.retries;
        let ph = self.placeholders(Some(s));
        let argv = agent
            .command
            .as_deref()
            .ok_or_else(|| "no agent command is configured".to_string())
            .and_then(|c| ph.expand_argv(c))
            .map_err(|e| Failure::config(format!("{rel}: agent.command: {e}")))?;
        let parent = info
            .parent
            .and_then(|p| self.full_id(p))
            .map(String::from)
            .unwrap_or_default();
        // The sandbox's HOME etc. (runs in the view only: a run as the daemon's uid keeps the
        // daemon's HOME, where the operator's CLI logins are), then agent.env, then the secrets
        // (docs/SPEC.md §5, §12; docs/PROTOCOL-NOTES.md XT6).
        let mut env: BTreeMap<String, String> = BTreeMap::new();
        let in_view = crate::sandbox::applies(&self.st.config.sandbox);
        if let (Some(a), true) = (&self.env.agents, in_view) {
            env.extend(crate::sandbox::env::run_env(
                std::path::Path::new(&ph.smith_dir),
                a.name_of(&info.full_id),
            ));
        }
        env.extend(agent.env.clone());
        env.extend(self.env.secrets.vars().iter().cloned());
        for (k, v) in [
            ("SMITH_ID", info.id.clone()),
            ("SMITH_FULL_ID", info.full_id.to_string()),
            ("SMITH_LEVEL", info.level.to_string()),
            ("SMITH_PARENT", parent),
            ("SMITH_DIR", ph.smith_dir.clone()),
            ("SMITH_TASK_FILE", ph.task_file.clone()),
            ("SMITH_WAKE", wake.as_str().to_string()),
            ("SMITH_MOUNT", ph.mount.clone()),
        ] {
            env.insert(k.to_string(), v);
        }
        // The run's output goes through a pipe the pump drains into messages.log, bounded by
        // the smith's quota and the store's reserve (docs/PROTOCOL-NOTES.md L17).
        let run_id = &attempt.run_id;
        let (stream, output) = output::pipe()
            .and_then(|(r, w)| {
                let sink = Sink {
                    log: dir.log.try_clone()?,
                    log_ino: dir.log_ino,
                    home: Some(run_home(s)),
                    run: Some((info.full_id.clone(), run_id.clone())),
                    path: format!("{rel}/conversations/{run_id}/messages.log"),
                    mask: self.env.secrets.masker(),
                };
                Ok((self.env.pump.add(r, sink)?, w))
            })
            .map_err(|e| Failure::spawn(format!("cannot make the run's output pipe: {e}")))?;
        let spec = RunSpec {
            smith: s,
            run_id: run_id.clone(),
            argv: argv.clone(),
            env,
            cwd: PathBuf::from(&ph.smith_dir),
            output,
            confine: agent.confine,
            sandbox: crate::sandbox::applies(&self.st.config.sandbox)
                .then(|| crate::sandbox::view::Plan::for_mount(&self.st.config, &self.env.mount))
                .map(|p| self.env.as_agent(p, &info.full_id))
                .transpose()
                .map_err(|e| Failure::spawn(format!("sandbox: {e}")))?,
            time_limit: Duration::from_secs(
                agent.timeout_secs.saturating_add(agent.kill_grace_secs),
            ),
        };
        let oom_base = self.env.binder.oom_kills(s);
        let spawning = Instant::now();
        let started = self
            .env
            .launcher
            .submit(&self.env, spec)
            .map_err(Failure::spawn)?;
        Ok(Begun {
            command: argv,
            agent,
            stream,
            oom_base,
            spawning,
            started,
        })
    }

    /// Make the directory of `s`'s next run in `<rel>/conversations/`, announcing a re-made
    /// `conversations/` at once (docs/PROTOCOL-NOTES.md U13) and the run directory, charged to
    /// the smith; its id goes into `attempt` (also when it fails).
    fn make_run_dir(
        &mut self,
        s: SmithIdx,
        rel: &str,
        attempt: &mut Attempt,
    ) -> Result<RunDir, Failure> {
        let next = self.st.recs.entry(s).or_default().next_run;
        attempt.run_id = format!("run-{next:04}");
        let conv = runner::conversations(self.env.root.as_fd(), Path::new(rel))
            .map_err(|e| Failure::spawn(format!("cannot create {rel}/conversations: {e}")))?;
        if let Some(smith_dir) = conv.made_in {
            let conversations = std::ffi::OsStr::new("conversations");
            self.env.writes.made(smith_dir, conversations, &[], None);
        }
        let rec = self.st.recs.entry(s).or_default();
        let dir = loop {
            attempt.run_id = format!("run-{:04}", rec.next_run);
            match runner::create_run_dir(conv.dir.as_fd(), &attempt.run_id) {
                Ok(d) => {
                    rec.next_run += 1;
                    break d;
                }
                Err(nix::errno::Errno::EEXIST) => rec.next_run += 1,
                Err(e) => {
                    let id = &attempt.run_id;
                    let msg = format!("cannot create {rel}/conversations/{id}: {e}");
                    return Err(Failure::spawn(msg));
                }
            }
        };
        let made = [dir.dir.as_fd(), dir.log.as_fd()];
        let name = std::ffi::OsStr::new(&attempt.run_id);
        self.env
            .writes
            .made(dir.conv_ino, name, &made, Some(run_home(s)));
        Ok(dir)
    }

    /// The smith's effective agent config: the mount-wide one merged with its own
    /// `config.json`. Errors: a one-line reason naming the file and key.
    fn smith_agent(&self, rel: &str) -> Result<AgentConfig, String> {
        let path = Path::new(rel).join("config.json");
        match backing::read_file_at_most(self.env.root.as_fd(), &path, SMITH_CONFIG_MAX) {
            Err(nix::errno::Errno::ENOENT) => Ok(self.st.config.agent.clone()),
            Err(nix::errno::Errno::EINVAL) => {
                Err(format!("{rel}/config.json is not a regular file"))
            }
            Err(nix::errno::Errno::EFBIG) => Err(format!(
                "{rel}/config.json is larger than {SMITH_CONFIG_MAX} bytes"
            )),
            Err(e) => Err(format!("cannot read {rel}/config.json: {e}")),
            Ok(bytes) => {
                let text = String::from_utf8(bytes)
                    .map_err(|_| format!("{rel}/config.json: not UTF-8"))?;
                SmithConfig::parse(&text)
                    .map(|c| c.merged(&self.st.config.agent))
                    .map_err(|e| format!("{rel}/{e}"))
            }
        }
    }

    /// A run whose process started: its `meta.json`, its record, `run.started`, a reaper, and
    /// its place in the live table (finished at once if it cannot be followed).
    fn track(
        &mut self,
        s: SmithIdx,
        wake: Wake,
        t0: SystemTime,
        run_id: String,
        dir: RunDir,
        begun: Begun,
    ) {
        let Begun {
            command,
            agent,
            stream,
            oom_base,
            started,
            ..
        } = begun;
        let (pid, job) = match &started {
            Submitted::Process(p) => (Some(p.pid), None),
            Submitted::Job(j) => (None, Some(j.clone())),
        };
        let start = time::format(t0);
        let cgroup = pid.and_then(|_| self.env.binder.cgroup_path(s));
        let meta = Meta {
            run_id: run_id.clone(),
            smith: self.full_id(s).map(String::from).unwrap_or_default(),
            command,
            wake: wake.as_str().into(),
            pid,
            pgid: pid.map(|p| p as i32),
            cgroup: cgroup.clone(),
            start: start.clone(),
            job_id: job.clone(),
            ..Meta::default()
        };
        self.env.writes.meta(s, dir.dir.as_fd(), dir.dir_ino, &meta);
        if let Some(rec) = self.st.recs.get_mut(&s) {
            rec.runs += 1;
            rec.last_run = Some(LastRun {
                run_id: run_id.clone(),
                wake: wake.as_str().into(),
                started: start,
                where_: Some(match &job {
                    Some(j) => format!("slurm:{j}"),
                    None => "local".into(),
                }),
                ..LastRun::default()
            });
        }
        let mut ev = self.ev("run.started", s);
        ev.run_id = Some(run_id.clone());
        ev.wake = Some(wake.as_str().into());
        ev.pid = pid;
        ev.pgid = pid.map(|p| p as i32);
        ev.cgroup = cgroup;
        ev.job_id = job.clone();
        let timeout = Duration::from_secs(agent.timeout_secs);
        // A job waits in Slurm's queue first: its clock starts when it runs (JobRunning).
        let deadline = match job {
            Some(_) => Instant::now() + QUEUE_WAIT_UNBOUNDED,
            None => Instant::now() + timeout,
        };
        // Without a reaper the run cannot be followed: it was killed, and it ends now.
        let exit = match started {
            Submitted::Process(started) => {
                ev.start_ticks = started.start_ticks;
                self.record(ev);
                launch::follow(&self.env, s, &run_id, started)
                    .err()
                    .map(Err)
            }
            Submitted::Job(_) => {
                self.record(ev);
                None
            }
        };
        let unfollowed = exit.is_some();
        let result_before = store_facts::result_time(self.env.root.as_fd(), &self.rel_dir(s));
        let live = Live {
            run_id,
            pgid: pid.map_or(0, |p| p as i32),
            job,
            timeout,
            verdict: None,
            deadline,
            grace: Duration::from_secs(agent.kill_grace_secs),
            retries: agent.retries,
            stop: None,
            exit,
            dir,
            meta,
            oom_base,
            committing: false,
            output: Some(stream),
            published: false,
            result_before,
        };
        self.st.live.insert(s, live);
        if unfollowed {
            self.finalize(s);
        }
    }

    /// A run that could not start: its reason goes to its `messages.log`, its `meta.json` and
    /// the journal (`run.exited` with `error`), and the end-of-run rule treats it as failed.
    fn fail_start(
        &mut self,
        s: SmithIdx,
        wake: Wake,
        attempt: Attempt,
        dir: Option<RunDir>,
        failure: Failure,
    ) {
        let Failure { reason, error } = failure;
        let now = time::now();
        let run_id = attempt.run_id;
        if let Some(d) = &dir {
            let line = format!("smithfs: {error}\n");
            let _ = (self.env.writes).append(
                d.log.as_fd(),
                d.log_ino,
                line.as_bytes(),
                Some(run_home(s)),
            );
            let meta = Meta {
                run_id: run_id.clone(),
                smith: self.full_id(s).map(String::from).unwrap_or_default(),
                wake: wake.as_str().into(),
                start: now.clone(),
                end: Some(now.clone()),
                error: Some(error.clone()),
                ..Meta::default()
            };
            self.env.writes.meta(s, d.dir.as_fd(), d.dir_ino, &meta);
        }
        let rel = self.rel_dir(s);
        let has_result = store_facts::has_result(self.env.root.as_fd(), &rel);
        if let Some(r) = self.st.recs.get_mut(&s) {
            r.last_run = Some(LastRun {
                run_id: run_id.clone(),
                wake: wake.as_str().into(),
                started: now.clone(),
                ended: Some(now),
                reason: Some(reason.into()),
                error: Some(error.clone()),
                ..LastRun::default()
            });
        }
        let outcome = (self.st.queue).exited(s, RunEnd::NotStarted, has_result, attempt.retries);
        let mut ev = self.ev("run.exited", s);
        ev.run_id = Some(run_id);
        ev.wake = Some(wake.as_str().into());
        ev.error = Some(error);
        ev.reason = Some(reason.into());
        super::finish::set_outcome(&mut ev, outcome);
        self.record(ev);
        self.drain_notes();
    }
}
