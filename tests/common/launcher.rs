//! The launcher dimension of the attack suites (docs/SPEC.md §13, issue 28): the same attempt
//! made by a process on this host — `smithfs run --smith` binds it, or the scheduler starts it
//! as a local run — or by the agent of a run of the `loopback` launcher, which is `smithfs
//! attach` on this host: every request of the agent crosses the run's TLS connection from
//! `attach`'s own remote mount of the tree, and its sandbox is the one `attach` starts from the
//! daemon's plan. Tests take a [`Launcher`] beside the identity mode; their `_loopback_` variants
//! are the remote ones.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::{run_as, Run, TestMount};

/// Where a smith's process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// On this host, in the daemon's own mount (`launcher.kind` `local`, the default).
    Local,
    /// Through `smithfs attach` on this host (`launcher.kind` `loopback`): the path a Slurm job's
    /// agent takes, without Slurm.
    Loopback,
    /// As a job of the throwaway Slurm cluster whose `slurm.conf` this names (`launcher.kind`
    /// `slurm`, tests/common/slurm.rs): `attach` on the cluster's node.
    Slurm(&'static str),
}

/// The agent of a [`Launcher::Loopback`] mount whose config names none: the newest task file is
/// `{"cwd": DIR, "argv": [...]}`; the agent runs ARGV in DIR with its stderr into the run's log
/// and prints `SMITHFS-TEST-RESULT TASK CODE DEV STDOUT-HEX` once ARGV ended (CODE negative:
/// killed by that signal; DEV the device of DIR as the agent sees it). Each task runs once,
/// whatever the run's wake (`private/.dispatched` lists those done): a task that arrives while a
/// `children` wake is starting may be run by it. No braces: `agent.command` substitutes
/// placeholders.
const DISPATCH: &str = r#"
import json, os, subprocess, sys
task = os.environ.get("SMITH_TASK_FILE", "")
name = os.path.basename(task)
seen = os.path.join(os.environ["SMITH_DIR"], "private", ".dispatched")
try:
    with open(seen) as f:
        done = f.read().split()
except OSError:
    done = []
if not task or name in done:
    sys.exit(0)
try:
    with open(task) as f:
        t = json.load(f)
except (OSError, ValueError):
    sys.exit(0)
with open(seen, "a") as f:
    f.write(name + "\n")
r = subprocess.run(t["argv"], cwd=t["cwd"], stdout=subprocess.PIPE)
sys.stderr.flush()
print("\nSMITHFS-TEST-RESULT %s %d %d %s" % (name, r.returncode, os.stat(t["cwd"]).st_dev, r.stdout.hex()), flush=True)
"#;

/// The system's python3 (a sandboxed run sees the system directories, not an operator's own
/// install under a 0700 home, docs/SPEC.md §12).
fn python() -> &'static str {
    if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

impl Launcher {
    /// Both, local first.
    pub const ALL: [Launcher; 2] = [Launcher::Local, Launcher::Loopback];

    /// `local` or `loopback`, as `launcher.kind` spells it.
    pub fn kind(self) -> &'static str {
        match self {
            Launcher::Local => "local",
            Launcher::Loopback => "loopback",
            Launcher::Slurm(_) => "slurm",
        }
    }

    /// `config` for this launcher: unchanged for `Local`; for `Loopback`, `launcher.kind`
    /// `loopback`, and where `agent.command` is unset the dispatching agent that
    /// [`Launcher::run_as`] drives (with `agent.retries` 0 unless set).
    pub fn config(self, config: &serde_json::Value) -> serde_json::Value {
        let mut c = config.clone();
        if self == Launcher::Local {
            return c;
        }
        if !c.is_object() {
            c = serde_json::json!({});
        }
        c["launcher"] = match self {
            Launcher::Slurm(_) => serde_json::json!({"kind": "slurm", "listen": "127.0.0.1:0"}),
            _ => serde_json::json!({"kind": "loopback"}),
        };
        if !c["agent"].is_object() {
            c["agent"] = serde_json::json!({});
        }
        if c["agent"]["command"].is_null() {
            c["agent"]["command"] = serde_json::json!([python(), "-c", DISPATCH]);
        }
        if c["agent"]["retries"].is_null() {
            c["agent"]["retries"] = serde_json::json!(0);
        }
        c
    }

    /// A mount in identity `mode` with `config` for this launcher ([`Launcher::config`]).
    pub fn mount(self, config: &serde_json::Value, mode: &'static str) -> TestMount {
        TestMount::with_config(&self.config(config), mode, self.env())
    }

    /// What the daemon's environment needs for this launcher: the cluster's `SLURM_CONF`.
    pub fn env(self) -> Vec<(&'static str, &'static str)> {
        match self {
            Launcher::Slurm(conf) => vec![("SLURM_CONF", conf)],
            _ => Vec::new(),
        }
    }

    /// `argv` in `cwd` (absolute, inside the mount) as smith `full_id`, to its end: for `Local`
    /// a `smithfs run --mount CWD --smith FULL_ID` (a local process bound to the smith); for
    /// `Loopback` a task for the mount's dispatching agent (its config from
    /// [`Launcher::config`]), so ARGV is the agent's child in `attach`'s remote mount (checked:
    /// the agent's CWD is on another device than the daemon's mount). `stdout` is ARGV's; for
    /// `Loopback`, `stderr` is the run's whole `messages.log`.
    pub fn run_as(self, m: &TestMount, cwd: &Path, full_id: &str, argv: &[&str]) -> Run {
        match self {
            Launcher::Local => run_as(cwd, full_id, argv),
            Launcher::Loopback | Launcher::Slurm(_) => remote_run_as(m, cwd, full_id, argv),
        }
    }
}

/// The text of a task that makes the dispatching agent of a [`Launcher::Loopback`] mount (its
/// config from [`Launcher::config`]) run `argv` in `cwd` (absolute, inside the mount).
pub fn dispatched(cwd: &Path, argv: &[&str]) -> String {
    serde_json::json!({"cwd": cwd, "argv": argv}).to_string()
}

/// Task names of [`remote_run_as`], unique in the test process.
static TASKS: AtomicU32 = AtomicU32::new(1);

fn remote_run_as(m: &TestMount, cwd: &Path, full_id: &str, argv: &[&str]) -> Run {
    let dir = m.path().join(super::msched::rel(full_id));
    let name = format!("task-t{}.md", TASKS.fetch_add(1, Ordering::Relaxed));
    let task = dispatched(cwd, argv);
    // The task is assigned at its close: the run reads it whole.
    let inbox = dir.join("inbox").join(&name);
    std::fs::write(&inbox, task)
        .unwrap_or_else(|e| panic!("the task for {full_id} at {}: {e}", inbox.display()));
    let marker = format!("SMITHFS-TEST-RESULT {name} ");
    let conversations = dir.join("conversations");
    let found = || {
        let runs = std::fs::read_dir(&conversations).ok()?;
        runs.flatten().find_map(|r| {
            let log = std::fs::read_to_string(r.path().join("messages.log")).ok()?;
            let line = log
                .lines()
                .find_map(|l| l.strip_prefix(&marker))?
                .to_owned();
            Some((log, line))
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let (log, line) = loop {
        if let Some(got) = found() {
            break got;
        }
        if std::time::Instant::now() > deadline {
            panic!(
                "no run of {full_id} ran its {name} within 120 s; its runs:\n{}\nthe journal's last lines:\n{}",
                runs_of(&conversations),
                tail(&m.path().join(".smithfs/events.jsonl"), 30)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut f = line.split_whitespace();
    let code: i32 = f
        .next()
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no exit code in {line:?}"));
    let dev = f.next().unwrap_or_default();
    let local_dev = std::fs::metadata(cwd).expect("stat the cwd").dev();
    assert_ne!(
        dev,
        local_dev.to_string(),
        "{full_id}'s run worked in the daemon's own mount, not its remote one:\n{log}"
    );
    let hex = f.next().unwrap_or_default();
    let bytes: Vec<u8> = (0..hex.len() / 2)
        .filter_map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok())
        .collect();
    Run {
        code: (code >= 0).then_some(code),
        stdout: String::from_utf8_lossy(&bytes).into_owned(),
        stderr: log,
    }
}

/// Every run under `conversations`: its `meta.json` and the end of its `messages.log`.
fn runs_of(conversations: &Path) -> String {
    let mut runs: Vec<_> = std::fs::read_dir(conversations)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    runs.sort();
    runs.iter()
        .map(|r| {
            let meta = std::fs::read_to_string(r.join("meta.json")).unwrap_or_default();
            format!(
                "{}: {meta}\n{}",
                r.display(),
                tail(&r.join("messages.log"), 10)
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The last `n` lines of `path` (empty when unreadable).
fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
