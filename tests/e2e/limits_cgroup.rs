//! cgroup limits (docs/SPEC.md §5 "Resource limits", §8 `limits.per_smith` / `limits.per_subtree`)
//! on real mounts with real agents: a memory hog is killed by its own limit and journaled
//! `reason: oom`, a fork bomb gets `EAGAIN`, a busy loop is throttled, and a sibling keeps
//! working meanwhile; limits hold across a restart; configured limits that cannot be enforced
//! refuse the mount with one line.
//!
//! The same tests run on either backend: the v1 controller hierarchies of a hybrid host (this
//! CI machine) or the unified hierarchy's v2 controllers. A test that cannot run here (not
//! root, no controllers) says so on stderr and returns.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::msched::*;
use common::{is_root, poll_until, smithfs};
use serde_json::{json, Value};
use smithfs::limits::cgroup::{detect, Place};
use smithfs::limits::Controller;
use smithfs::sys::procfs;

/// The agent of these tests: the first line of the task is a directive.
/// `split` makes one child per further line and gives it that line as its task; `hog` execs a
/// process that allocates until it is killed; `bomb` forks sleeping children until a fork
/// fails and records the errno and how many it made; `busy` spins for 2 s of wall time and
/// records the CPU seconds it got; `ok` publishes.
const AGENT: &str = concat!(
    agent_prelude!(),
    agent_split!(),
    r#"hog) exec python3 -c '
b = []
while True:
    b.append(bytearray(4 << 20))
' ;;
bomb) python3 -c '
import os, time, errno, signal
kids = []
err = "none"
while len(kids) < 500:
    try:
        pid = os.fork()
    except OSError as e:
        err = errno.errorcode.get(e.errno, str(e.errno))
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    kids.append(pid)
for k in kids:
    os.kill(k, signal.SIGKILL)
for k in kids:
    os.waitpid(k, 0)
open("private/bomb.txt", "w").write("%s after %d\n" % (err, len(kids)))
'
  publish "bomb: $(cat private/bomb.txt)" ;;
busy) python3 -c '
import os, time
end = time.monotonic() + 2
while time.monotonic() < end:
    pass
t = os.times()
open("private/cpu.txt", "w").write("%.3f\n" % (t.user + t.system))
'
  publish "busy: $(cat private/cpu.txt)" ;;
ok) publish "ok from $SMITH_ID" ;;
*) echo "unknown directive $cmd"; exit 2 ;;
esac
"#
);

/// Can this test run here? Root, python3, and the three controllers somewhere; else why not.
fn unavailable() -> Option<String> {
    if !is_root() {
        return Some("needs root (cgroups)".into());
    }
    if std::process::Command::new("python3")
        .arg("-c")
        .arg("")
        .status()
        .map_or(true, |s| !s.success())
    {
        return Some("needs python3".into());
    }
    let a = smithfs::limits::cgroup::detect_here();
    let missing: Vec<&str> = Controller::ALL
        .iter()
        .filter(|c| !a.controllers.contains_key(c))
        .map(|c| c.as_str())
        .collect();
    (!missing.is_empty()).then(|| format!("no {} controller here", missing.join(", ")))
}

macro_rules! skip_unless_limits {
    () => {
        if let Some(why) = unavailable() {
            eprintln!("skipped: {why}");
            return;
        }
    };
}

/// The cgroup directory of `controller` for smith `full` (`leaf`: its `self/`, else its node)
/// of the daemon `pid`, on whichever backend holds that controller.
fn limit_dir(pid: i32, controller: Controller, full: &str, leaf: bool) -> PathBuf {
    let mounts =
        procfs::parse_mountinfo(&std::fs::read("/proc/self/mountinfo").expect("mountinfo"))
            .expect("parse mountinfo");
    let own = procfs::parse_cgroup(&std::fs::read(format!("/proc/{pid}/cgroup")).expect("cgroup"))
        .expect("parse cgroup");
    let a = detect(&mounts, &own, &|p| std::fs::read_to_string(p).ok());
    let base = match a.controllers.get(&controller).expect("controller") {
        Place::V2 { base } | Place::V1 { base } => base.clone(),
    };
    let mut d = base.join(format!("smithfs-{pid}")).join(full);
    if leaf {
        d.push("self");
    }
    d
}

fn is_v1(controller: Controller) -> bool {
    matches!(
        smithfs::limits::cgroup::detect_here()
            .controllers
            .get(&controller),
        Some(Place::V1 { .. })
    )
}

fn read_num(dir: &Path, file: &str) -> Option<u64> {
    std::fs::read_to_string(dir.join(file))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The value of `key N` lines (`memory.events`, `cpu.stat`, `pids.events`).
fn keyed(dir: &Path, file: &str, key: &str) -> Option<u64> {
    std::fs::read_to_string(dir.join(file))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
}

const MEM: u64 = 48 << 20;

fn limits_config() -> Value {
    json!({
        "scheduler": {"max_concurrent": 5},
        "agent": {"retries": 0, "timeout_secs": 120},
        "limits": {
            "per_smith": {"memory_max": "48M", "pids_max": 16, "cpu_max": "20000 100000"},
            "per_subtree": {"memory_max": "512M", "pids_max": 200}
        }
    })
}

fn limited_mount() -> Sm {
    let s = Sm::new(limits_config());
    std::fs::write(s.p("agents/agent.sh"), AGENT).expect("agent");
    s
}

/// A memory hog, a fork bomb and a busy loop in three children, each bounded by its own
/// limit, while a fourth sibling publishes and the root collects: the hog's run is
/// `run.exited` with `reason: oom` (and only its run), the bomb's fork fails with EAGAIN
/// before `pids_max`, the busy loop is throttled to its `cpu_max`, and the peaks stay within
/// the limits.
#[test]
fn hog_bomb_and_busy_loop_stay_in_their_limits_while_a_sibling_works() {
    skip_unless_limits!();
    let s = limited_mount();
    let pid = s.m.daemon_pid().expect("daemon");
    // The tree's cgroups carry the limits: nodes the subtree's, leaves the smith's.
    let root_mem_node = limit_dir(pid, Controller::Memory, "smith-root", false);
    let root_pids_leaf = limit_dir(pid, Controller::Pids, "smith-root", true);
    let (mem_file, peak_file) = if is_v1(Controller::Memory) {
        ("memory.limit_in_bytes", "memory.max_usage_in_bytes")
    } else {
        ("memory.max", "memory.peak")
    };
    assert_eq!(read_num(&root_mem_node, mem_file), Some(512 << 20));
    assert_eq!(read_num(&root_pids_leaf, "pids.max"), Some(16));

    s.task("split\nhog\nbomb\nbusy\nok\n");
    let fin = s.wait_file(120, "results/final.md");

    const HOG: &str = "smith-root/smith-001";
    const BOMB: &str = "smith-root/smith-002";
    const BUSY: &str = "smith-root/smith-003";
    assert!(fin.contains("ok from smith-004"), "{fin}");

    let exited = s.of("run.exited", None);
    let hog: Vec<&Value> = exited.iter().filter(|e| e["smith"] == HOG).collect();
    assert_eq!(hog.len(), 1, "{exited:#?}");
    assert_eq!(hog[0]["reason"], "oom", "{:#}", hog[0]);
    assert_eq!(hog[0]["signal"], 9, "{:#}", hog[0]);
    assert!(hog[0]["oom_kills"].as_u64() >= Some(1), "{:#}", hog[0]);
    for e in exited.iter().filter(|e| e["smith"] != HOG) {
        assert_ne!(e["reason"], "oom", "only the hog's run is oom: {e:#}");
    }
    let st = s.status();
    let hog_status = st["smiths"]
        .as_array()
        .and_then(|a| a.iter().find(|x| x["full_id"] == HOG))
        .expect("the hog in status");
    assert_eq!(hog_status["last_run"]["reason"], "oom", "{hog_status:#}");
    let meta = &s.metas(HOG)[0];
    assert!(meta["oom_kills"].as_u64() >= Some(1), "{meta:#}");
    let hog_mem = limit_dir(pid, Controller::Memory, HOG, true);
    assert_eq!(read_num(&hog_mem, mem_file), Some(MEM));
    let peak = read_num(&hog_mem, peak_file).expect("peak");
    assert!(peak <= MEM, "peak {peak} above the limit {MEM}");
    assert!(peak > MEM / 2, "the hog reached its limit: peak {peak}");

    let bomb = s
        .read(&format!("{}/outbox/result.md", rel(BOMB)))
        .expect("bomb result");
    let n: u32 = bomb
        .trim()
        .strip_prefix("bomb: EAGAIN after ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("fork failed with EAGAIN: {bomb}"));
    // The agent's sh and python count too.
    assert!((8..=14).contains(&n), "forks before EAGAIN: {n}");
    let bomb_pids = limit_dir(pid, Controller::Pids, BOMB, true);
    assert!(keyed(&bomb_pids, "pids.events", "max ").unwrap_or(0) >= 1);

    let busy = s
        .read(&format!("{}/outbox/result.md", rel(BUSY)))
        .expect("busy result");
    let cpu: f64 = busy
        .trim()
        .strip_prefix("busy: ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("cpu seconds: {busy}"));
    // 0.2 CPU for 2 s of wall time is 0.4 s; a bit more for the period boundaries.
    assert!(
        cpu <= 0.6,
        "the busy loop got {cpu} s of CPU in 2 s at 0.2 CPU"
    );
    let busy_cpu = limit_dir(pid, Controller::Cpu, BUSY, true);
    assert!(
        keyed(&busy_cpu, "cpu.stat", "nr_throttled ").unwrap_or(0) >= 1,
        "{}",
        std::fs::read_to_string(busy_cpu.join("cpu.stat")).unwrap_or_default()
    );
    eprintln!("hog peak {peak} B of {MEM}; bomb EAGAIN after {n} forks of 16 pids; busy {cpu} s CPU in 2 s at 0.2 CPU");
}

/// A restart keeps the limits: the smiths found by the start-up scan get their cgroups with
/// the same limits, and a new run is bounded again.
#[test]
fn limits_hold_after_a_restart() {
    skip_unless_limits!();
    let mut s = limited_mount();
    s.task("bomb\n");
    let first = s.wait_file(60, "smiths/smith-root/outbox/result.md");
    assert!(first.starts_with("bomb: EAGAIN after "), "{first}");
    s.m.remount();
    let pid = s.m.daemon_pid().expect("daemon");
    let leaf = limit_dir(pid, Controller::Pids, "smith-root", true);
    assert_eq!(read_num(&leaf, "pids.max"), Some(16));
    let node = limit_dir(pid, Controller::Pids, "smith-root", false);
    assert_eq!(read_num(&node, "pids.max"), Some(200));
    std::fs::remove_file(s.p("smiths/smith-root/outbox/result.md")).expect("rm result");
    s.write("smiths/smith-root/inbox/task-2.md", "bomb\n");
    let second = s.wait_file(60, "smiths/smith-root/outbox/result.md");
    assert!(second.starts_with("bomb: EAGAIN after "), "{second}");
}

/// Limits that cannot be enforced refuse the mount with one line naming what is missing:
/// ancestry identity has no cgroups to put them on.
#[test]
fn limits_in_ancestry_mode_refuse_the_mount() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("m");
    smithfs(["init", dir.to_str().expect("utf-8")]).expect_ok("init");
    std::fs::write(
        dir.join("config.json"),
        r#"{"limits": {"per_smith": {"pids_max": 10}}}"#,
    )
    .expect("config");
    let r = smithfs([
        "mount",
        dir.to_str().expect("utf-8"),
        "--identity",
        "ancestry",
    ]);
    if r.ok() {
        let _ = smithfs(["umount", dir.to_str().expect("utf-8")]);
        panic!("mounted with limits in ancestry mode");
    }
    let err = r.stderr.trim();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("limits.per_smith.pids_max needs cgroup identity, but identity is ancestry"),
        "{err}"
    );
    poll_until(Duration::from_secs(5), "no mount left", || {
        !common::is_smithfs_mounted(&dir)
    });
}

/// A per-smith limit above the subtree's is clamped to it (a smith's own processes are part of
/// its subtree), and the clamp is journaled as `limits.clamped` naming the key.
#[test]
fn per_smith_limits_above_the_subtree_are_clamped_and_journaled() {
    skip_unless_limits!();
    let s = Sm::new(json!({
        "limits": {
            "per_smith": {"pids_max": 500, "memory_max": "64M"},
            "per_subtree": {"pids_max": 50}
        }
    }));
    let pid = s.m.daemon_pid().expect("daemon");
    let leaf = limit_dir(pid, Controller::Pids, "smith-root", true);
    assert_eq!(read_num(&leaf, "pids.max"), Some(50));
    let node = limit_dir(pid, Controller::Pids, "smith-root", false);
    assert_eq!(read_num(&node, "pids.max"), Some(50));
    let clamped = s.of("limits.clamped", None);
    assert_eq!(clamped.len(), 1, "{clamped:#?}");
    assert_eq!(clamped[0]["rule"], "limits.per_smith.pids_max");
}
