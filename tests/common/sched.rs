//! Helpers for the scheduler's integration tests: a plain temp dir laid out by `smithfs init`,
//! used as both store and "mount" (no FUSE), a scheduler on it, and polling with deadlines.

use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use serde_json::Value;
use smithfs::config::Config;
use smithfs::fs::backing;
use smithfs::sched::runner::BindTo;
use smithfs::sched::{NoBinder, NoInvalidate, RunBinder, SchedCtx, Scheduler};
use smithfs::tree::model::SmithIdx;
use smithfs::tree::registry::Registry;

/// A laid-out directory.
pub struct Env {
    pub _tmp: tempfile::TempDir,
    pub dir: PathBuf,
    pub registry: Arc<Registry>,
}

/// `smithfs init DIR [--task T]` in a fresh temp dir.
pub fn init(task: Option<&str>) -> Env {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("a");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_smithfs"));
    cmd.arg("init").arg(&dir);
    if let Some(t) = task {
        cmd.arg("--task").arg(t);
    }
    let out = cmd.output().expect("run smithfs init");
    assert!(
        out.status.success(),
        "init: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Env {
        _tmp: tmp,
        dir,
        registry: Arc::new(Registry::new()),
    }
}

impl Env {
    /// A path inside the directory.
    pub fn p(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    /// Write a file (creating parents).
    pub fn write(&self, rel: &str, content: &str) {
        let p = self.p(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).expect("mkdir");
        }
        std::fs::write(&p, content).expect("write");
    }

    /// Make child smith dirs as the scaffold would (the areas only): `full` like
    /// `smith-root/smith-001`.
    pub fn make_child(&self, full: &str) {
        let mut parts = full.split('/');
        let mut rel = format!("smiths/{}", parts.next().unwrap_or("smith-root"));
        for p in parts {
            rel.push_str("/children/");
            rel.push_str(p);
        }
        for area in ["inbox", "private", "outbox", "children", "conversations"] {
            std::fs::create_dir_all(self.p(&format!("{rel}/{area}"))).expect("mkdir area");
        }
    }

    /// Install `script` as `agents/agent.sh` and return a config using it.
    pub fn config_with_agent(&self, script: &str, extra: impl FnOnce(&mut Config)) -> Config {
        self.write("agents/agent.sh", script);
        let mut c = Config::default();
        c.agent.command = Some(vec!["sh".into(), "{mount}/agents/agent.sh".into()]);
        c.agent.timeout_secs = 60;
        c.agent.retries = 0;
        c.agent.kill_grace_secs = 1;
        // No mount here for a run's view: these are the scheduler's no-kernel tests. Sandboxed
        // runs are tested on real mounts (tests/e2e, tests/mount).
        c.sandbox.enabled = false;
        extra(&mut c);
        c
    }

    /// Start a scheduler with `NoBinder`.
    pub fn start(&self, config: Config) -> Scheduler {
        self.start_with(config, Arc::new(NoBinder), false)
    }

    /// Start a scheduler with `binder`.
    pub fn start_with(
        &self,
        config: Config,
        binder: Arc<dyn RunBinder>,
        resume: bool,
    ) -> Scheduler {
        let root: OwnedFd = backing::open_store_root(&self.dir).expect("open store root");
        Scheduler::start(
            SchedCtx {
                root,
                mount: self.dir.clone(),
                config,
                registry: self.registry.clone(),
                binder,
                invalidate: Arc::new(NoInvalidate),
                original_nofile: (0, 0),
                hook_user: None,
                storage: None,
                agents: None,
                secrets: Default::default(),
                remote: None,
            },
            resume,
        )
        .expect("start scheduler")
    }

    /// The journal's events.
    pub fn events(&self) -> Vec<Value> {
        let text =
            std::fs::read_to_string(self.p(".smithfs-state/events.jsonl")).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Events named `name` for smith `full` (None: any smith).
    pub fn events_of(&self, name: &str, full: Option<&str>) -> Vec<Value> {
        self.events()
            .into_iter()
            .filter(|e| e["event"] == name && full.map_or(true, |f| e["smith"] == f))
            .collect()
    }

    /// Read a file, if it exists.
    pub fn read(&self, rel: &str) -> Option<String> {
        std::fs::read_to_string(self.p(rel)).ok()
    }

    /// The smith index of `full`.
    pub fn idx(&self, full: &str) -> SmithIdx {
        self.registry.by_full_id(full).expect("registered smith")
    }

    /// Every `meta.json` of smith dir `rel`.
    pub fn metas(&self, rel: &str) -> Vec<Value> {
        let mut out = Vec::new();
        let Ok(rd) = std::fs::read_dir(self.p(&format!("{rel}/conversations"))) else {
            return out;
        };
        let mut dirs: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
        dirs.sort();
        for d in dirs {
            if let Ok(t) = std::fs::read_to_string(d.join("meta.json")) {
                if let Ok(v) = serde_json::from_str(&t) {
                    out.push(v);
                }
            }
        }
        out
    }
}

/// The smith `full` in a status value.
pub fn smith_status(status: &Value, full: &str) -> Value {
    status["smiths"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["full_id"] == full).cloned())
        .unwrap_or(Value::Null)
}

/// The state of `full` in the scheduler's status.
pub fn state(s: &Scheduler, full: &str) -> String {
    smith_status(&s.status(), full)["state"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

#[allow(unused_imports)] // used by the scheduler binaries, through `common::sched::*`
pub use super::poll_until;

/// Is process `pid` alive (and not a zombie)?
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            let state = s
                .rsplit_once(')')
                .and_then(|(_, r)| r.trim_start().chars().next());
            !matches!(state, Some('Z') | Some('X') | None)
        }
        Err(_) => false,
    }
}

/// Parse an RFC 3339 timestamp as seconds since the epoch (f64).
pub fn ts(v: &Value) -> f64 {
    let t = smithfs::sched::time::parse(v.as_str().unwrap_or("")).expect("timestamp");
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// A binder that puts every smith's runs into a cgroup of its own under a test cgroup of the
/// cgroup2 hierarchy (what the identity resolver does in cgroup mode), so a timeout or cancel
/// kills descendants that left the process group. `None` where cgroups cannot be made.
pub struct TestCgroupBinder {
    base: PathBuf,
}

impl TestCgroupBinder {
    pub fn new() -> Option<TestCgroupBinder> {
        let info = std::fs::read("/proc/self/mountinfo").ok()?;
        let mnt = smithfs::sys::procfs::parse_mountinfo(&info)
            .ok()?
            .into_iter()
            .find(|m| m.fs_type == "cgroup2")?
            .mount_point;
        let base = mnt.join(format!(
            "smithfs-test-{}-{}",
            std::process::id(),
            rand_suffix()
        ));
        std::fs::create_dir(&base).ok()?;
        Some(TestCgroupBinder { base })
    }

    fn dir(&self, s: SmithIdx) -> PathBuf {
        let d = self.base.join(format!("smith-{}", s.0));
        let _ = std::fs::create_dir(&d);
        d
    }
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(0)
}

impl RunBinder for TestCgroupBinder {
    fn cgroup_dir(&self, to: BindTo) -> Option<OwnedFd> {
        let BindTo::Smith(s) = to else {
            return None;
        };
        std::fs::File::open(self.dir(s)).ok().map(OwnedFd::from)
    }
    fn bind_pid(&self, pid: u32, s: SmithIdx) -> io::Result<()> {
        // Only when clone3 could not create the run in the cgroup.
        std::fs::write(self.dir(s).join("cgroup.procs"), pid.to_string())
    }
    fn kill_smith(&self, s: SmithIdx, sig: i32) {
        if sig == libc::SIGKILL {
            let _ = std::fs::write(self.dir(s).join("cgroup.kill"), "1");
            return;
        }
        if let Ok(procs) = std::fs::read_to_string(self.dir(s).join("cgroup.procs")) {
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                // SAFETY: plain kill(2).
                unsafe { libc::kill(pid, sig) };
            }
        }
    }
    fn cgroup_path(&self, s: SmithIdx) -> Option<String> {
        Some(self.dir(s).to_string_lossy().into_owned())
    }
    fn smith_has_processes(&self, s: SmithIdx) -> Option<bool> {
        let ev = std::fs::read_to_string(self.dir(s).join("cgroup.events")).ok()?;
        Some(ev.lines().any(|l| l == "populated 1"))
    }
}

impl Drop for TestCgroupBinder {
    fn drop(&mut self) {
        if let Ok(rd) = std::fs::read_dir(&self.base) {
            for e in rd.flatten() {
                let _ = std::fs::write(e.path().join("cgroup.kill"), "1");
                let _ = std::fs::remove_dir(e.path());
            }
        }
        let _ = std::fs::remove_dir(&self.base);
    }
}

/// Does `path` exist?
pub fn exists(p: &Path) -> bool {
    p.exists()
}
