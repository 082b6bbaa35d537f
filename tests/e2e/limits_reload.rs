//! `smithfs reload` (and SIGHUP) applies `limits` live (docs/SPEC.md §6, §8;
//! docs/PROTOCOL-NOTES.md L20) on real mounts, driven by the CLI as a user would: edit
//! config.json, reload, and the new limit holds — the scaffold's `max_children`/`max_level`,
//! `max_open_files_per_smith`, the cgroup limits of every existing smith and of smiths made
//! later — while limits that cannot be enforced are refused whole with `mount`'s one line.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::msched::merge;
use common::{is_root, run_as, smithfs, storage_of, MountOpts, Run, TestMount};
use serde_json::{json, Value};
use smithfs::limits::cgroup::{detect, Place};
use smithfs::limits::Controller;
use smithfs::sys::procfs;

/// A mount in identity mode `identity` (`None`: auto).
fn mount(identity: Option<&'static str>) -> TestMount {
    let mut extra = Vec::new();
    if let Some(i) = identity {
        extra.extend(["--identity", i]);
    }
    TestMount::with(MountOpts {
        allow_other: true,
        extra,
        ..MountOpts::default()
    })
}

/// Merge `patch` into the mount's config.json (written through the mount, as the operator).
fn patch_config(m: &TestMount, patch: Value) {
    let path = m.path().join("config.json");
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("config")).expect("JSON");
    merge(&mut cfg, &patch);
    std::fs::write(&path, serde_json::to_string_pretty(&cfg).expect("json")).expect("config");
}

fn reload(m: &TestMount) -> Run {
    smithfs([Path::new("reload"), m.path()])
}

fn reload_ok(m: &TestMount) -> String {
    let r = reload(m);
    assert_eq!(r.code, Some(0), "reload: {r:?}");
    r.stdout
}

fn events(m: &TestMount, name: &str) -> Vec<Value> {
    std::fs::read_to_string(m.path().join(".smithfs/events.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["event"] == name)
        .collect()
}

fn mkdir(m: &TestMount, rel: &str) -> std::io::Result<()> {
    std::fs::create_dir(m.path().join(rel))
}

/// Lowering `max_children` keeps the children a smith has and refuses the next one with
/// EDQUOT and a `why` naming the new limit; `max_level` likewise (EPERM); raising them again
/// (by SIGHUP) lets the next child be made. `whoami` and `status` show the limits in force.
/// In both identity modes.
#[test]
fn reload_changes_the_scaffold_limits_of_a_live_mount() {
    for identity in [None, Some("ancestry")] {
        let m = mount(identity);
        mkdir(&m, "smiths/smith-root/children/smith-001").expect("first child");
        mkdir(&m, "smiths/smith-root/children/smith-002").expect("second child");
        patch_config(&m, json!({"limits": {"max_children": 1, "max_level": 1}}));
        let out = reload_ok(&m);
        assert!(out.contains("limits changed"), "{identity:?}: {out}");
        let ev = events(&m, "config.reloaded");
        assert_eq!(
            ev.last().expect("config.reloaded")["changed"],
            json!(["limits"])
        );
        // The two children stay; a third is refused with the documented errno and a why.
        assert!(m
            .path()
            .join("smiths/smith-root/children/smith-002")
            .is_dir());
        let e = mkdir(&m, "smiths/smith-root/children/smith-003").expect_err("over max_children");
        assert_eq!(e.raw_os_error(), Some(libc::EDQUOT), "{identity:?}: {e}");
        let why = std::fs::read_to_string(m.path().join(".smithfs/why")).expect("why");
        assert!(
            why.contains("already has 2 children and limits.max_children is 1"),
            "{identity:?}: {why}"
        );
        // A grandchild would be at level 2, beyond the new max_level 1: EPERM.
        let e = mkdir(
            &m,
            "smiths/smith-root/children/smith-001/children/smith-001",
        )
        .expect_err("over max_level");
        assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{identity:?}: {e}");
        // whoami (of a smith) and status show the limits in force.
        let who = run_as(m.path(), "smith-root", &["cat", ".smithfs/whoami"]).expect_ok("whoami");
        assert!(who.contains("limits: max_level 1, max_children 1"), "{who}");
        let st = smithfs([Path::new("status"), m.path()]).expect_ok("status");
        assert!(st.contains("limits: max_level 1, max_children 1"), "{st}");
        let js: Value = serde_json::from_str(
            &smithfs([Path::new("status"), m.path(), Path::new("--json")]).expect_ok("status"),
        )
        .expect("status JSON");
        assert_eq!(js["limits"]["max_children"], 1, "{js}");

        // Raised again through SIGHUP: the next child is made.
        patch_config(&m, json!({"limits": {"max_children": 5, "max_level": 3}}));
        let pid = m.daemon_pid().expect("daemon pid");
        // SAFETY: signalling the daemon this test mounted.
        unsafe { libc::kill(pid, libc::SIGHUP) };
        common::poll_until(
            std::time::Duration::from_secs(10),
            "the second config.reloaded",
            || events(&m, "config.reloaded").len() >= 2,
        );
        mkdir(&m, "smiths/smith-root/children/smith-003").expect("third child after raising");
        mkdir(
            &m,
            "smiths/smith-root/children/smith-001/children/smith-001",
        )
        .expect("grandchild after raising");
    }
}

/// Lowering `max_open_files_per_smith` applies to the next open: a smith holding files gets
/// EMFILE beyond the new limit.
#[test]
fn reload_changes_the_open_files_per_smith() {
    let m = mount(None);
    patch_config(&m, json!({"limits": {"max_open_files_per_smith": 4}}));
    reload_ok(&m);
    let code = "import errno\nfs = []\ntry:\n    for i in range(20):\n        fs.append(open('smiths/smith-root/private/f%d' % i, 'w'))\n    print('opened', len(fs))\nexcept OSError as e:\n    print(errno.errorcode[e.errno], len(fs))";
    let out = run_as(m.path(), "smith-root", &["python3", "-c", code]).expect_ok("opens");
    // Its working directory and the control files it reads may hold a handle too.
    let (err, n) = out.trim().split_once(' ').expect("two words");
    assert_eq!(err, "EMFILE", "{out}");
    let n: usize = n.parse().expect("count");
    assert!(
        (1..=4).contains(&n),
        "opened {n} before EMFILE with a limit of 4"
    );
    let who = run_as(m.path(), "smith-root", &["cat", ".smithfs/whoami"]).expect_ok("whoami");
    assert!(who.contains("(limit 4)"), "{who}");
}

/// Limits that cannot be enforced are refused whole with the line `mount` prints, exit 1;
/// the old limits stay live and `config.reload_failed` is journaled.
#[test]
fn an_unenforceable_limit_refuses_the_reload_whole() {
    let m = mount(Some("ancestry"));
    patch_config(
        &m,
        json!({"limits": {"max_children": 0, "per_smith": {"pids_max": 10}}}),
    );
    let r = reload(&m);
    assert_eq!(r.code, Some(1), "{r:?}");
    let err = r.stderr.trim();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("limits.per_smith.pids_max needs cgroup identity, but identity is ancestry"),
        "{err}"
    );
    let failed = events(&m, "config.reload_failed");
    assert_eq!(failed.len(), 1, "{failed:?}");
    // max_children 0 was not applied either.
    mkdir(&m, "smiths/smith-root/children/smith-001").expect("the old max_children holds");
}

// ---- cgroup limits ----

/// Can the cgroup tests run here? Root, python3, and the three controllers; else why not.
fn cgroups_unavailable() -> Option<String> {
    if !is_root() {
        return Some("needs root (cgroups)".into());
    }
    if !Command::new("python3")
        .args(["-c", ""])
        .status()
        .is_ok_and(|s| s.success())
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

/// The cgroup directory of `controller` for smith `full` (`leaf`: its `self/`) of daemon `pid`.
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

fn read(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.join(file).display()))
        .trim()
        .to_string()
}

/// Forks sleeping children until a fork fails; prints the errno and how many it made.
const BOMB: &str = r#"
import os, time, errno, signal
kids = []
err = "none"
while len(kids) < 300:
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
print(err, len(kids))
"#;

fn bomb(m: &TestMount, full: &str) -> (String, usize) {
    let out = run_as(m.path(), full, &["python3", "-c", BOMB]).expect_ok("bomb");
    let (e, n) = out.trim().split_once(' ').expect("errno and count");
    (e.to_string(), n.parse().expect("count"))
}

/// cgroup limits turned on, changed and lifted by reloads on a mount made without any: every
/// existing smith's node and leaf hold the new values on the backend in use, a child made later
/// gets them, a fork bomb gets EAGAIN at the new bound, a per-smith limit above the subtree's
/// is clamped and journaled, and lifting a limit writes `max` back.
#[test]
fn reload_writes_cgroup_limits_into_every_smith_and_smiths_made_later() {
    if let Some(why) = cgroups_unavailable() {
        eprintln!("skipped: {why}");
        return;
    }
    let m = mount(None);
    let pid = m.daemon_pid().expect("daemon pid");
    mkdir(&m, "smiths/smith-root/children/smith-001").expect("child");
    // Before: unbounded.
    let (e, n) = bomb(&m, "smith-root/smith-001");
    assert_eq!(e, "none", "no pids limit yet: {e} after {n}");

    patch_config(
        &m,
        json!({"limits": {
            "per_smith": {"pids_max": 400, "memory_max": "256M", "cpu_max": "50000 100000"},
            "per_subtree": {"pids_max": 24}
        }}),
    );
    let out = reload_ok(&m);
    assert!(out.contains("limits changed"), "{out}");
    let clamped = events(&m, "limits.clamped");
    assert_eq!(clamped.len(), 1, "{clamped:?}");
    assert_eq!(clamped[0]["rule"], "limits.per_smith.pids_max");
    for full in ["smith-root", "smith-root/smith-001"] {
        let node = limit_dir(pid, Controller::Pids, full, false);
        let leaf = limit_dir(pid, Controller::Pids, full, true);
        assert_eq!(read(&node, "pids.max"), "24", "{full}");
        assert_eq!(read(&leaf, "pids.max"), "24", "{full} (clamped)");
    }
    let mem_leaf = limit_dir(pid, Controller::Memory, "smith-root/smith-001", true);
    let mem_file = if mem_leaf.join("memory.limit_in_bytes").exists() {
        "memory.limit_in_bytes"
    } else {
        "memory.max"
    };
    assert_eq!(read(&mem_leaf, mem_file), (256u64 << 20).to_string());
    let cpu_leaf = limit_dir(pid, Controller::Cpu, "smith-root/smith-001", true);
    if cpu_leaf.join("cpu.cfs_quota_us").exists() {
        assert_eq!(read(&cpu_leaf, "cpu.cfs_quota_us"), "50000");
    } else {
        assert_eq!(read(&cpu_leaf, "cpu.max"), "50000 100000");
    }
    let (e, n) = bomb(&m, "smith-root/smith-001");
    assert_eq!(e, "EAGAIN", "after {n} forks");
    assert!(
        (16..24).contains(&n),
        "forks before EAGAIN at pids_max 24: {n}"
    );

    // Lowered: the files follow, a child made afterwards gets the new value too.
    patch_config(&m, json!({"limits": {"per_subtree": {"pids_max": 12}}}));
    reload_ok(&m);
    mkdir(&m, "smiths/smith-root/children/smith-002").expect("child made later");
    for full in ["smith-root", "smith-root/smith-001", "smith-root/smith-002"] {
        let node = limit_dir(pid, Controller::Pids, full, false);
        assert_eq!(read(&node, "pids.max"), "12", "{full}");
    }
    let (e, n) = bomb(&m, "smith-root/smith-002");
    assert_eq!(e, "EAGAIN", "after {n} forks");
    assert!(
        (4..12).contains(&n),
        "forks before EAGAIN at pids_max 12: {n}"
    );

    // Lifted: `max` again, and the bomb runs free.
    patch_config(
        &m,
        json!({"limits": {"per_smith": {"pids_max": null, "memory_max": null, "cpu_max": null},
                          "per_subtree": {"pids_max": null}}}),
    );
    reload_ok(&m);
    let leaf = limit_dir(pid, Controller::Pids, "smith-root/smith-001", true);
    assert_eq!(read(&leaf, "pids.max"), "max");
    let (e, n) = bomb(&m, "smith-root/smith-001");
    assert_eq!(e, "none", "limit lifted: {e} after {n}");
    let st = smithfs([Path::new("status"), m.path()]).expect_ok("status");
    assert!(!st.contains("pids_max"), "{st}");
}

/// Storage quotas reload live (docs/SPEC.md §6, §8; docs/PROTOCOL-NOTES.md L21): turned on, the
/// books are built by a scan and count what the smith wrote before; lowered below its use, the
/// data stays, growth gets EDQUOT and deleting still works; raised, it may grow again; turned
/// off, nothing is refused. The counters equal a restart's scan.
#[test]
fn reload_turns_storage_quotas_on_lowers_raises_and_off() {
    const CHILD: &str = "smith-root/smith-001";
    let m = mount(None);
    mkdir(&m, "smiths/smith-root/children/smith-001").expect("mkdir");
    let private = m
        .path()
        .join("smiths/smith-root/children/smith-001/private")
        .display()
        .to_string();
    let write = |m: &TestMount, name: &str, kib: u64| {
        run_as(
            m.path(),
            CHILD,
            &[
                "sh",
                "-c",
                &format!(
                    "dd if=/dev/urandom of={private}/{name} bs=64k count={} 2>&1",
                    kib / 64
                ),
            ],
        )
    };
    let max_bytes = |m: &TestMount| {
        common::whoami_of(m.path(), CHILD)
            .into_iter()
            .find(|(k, _)| k == "storage max bytes")
            .map(|(_, v)| v)
    };
    write(&m, "before", 512).expect_ok("a write before any quota");
    assert_eq!(max_bytes(&m), None, "no storage lines without a quota");

    // On: what was written before counts.
    patch_config(
        &m,
        json!({"limits": {"max_bytes_per_smith": "1M", "max_inodes_per_smith": 50}}),
    );
    reload_ok(&m);
    assert_eq!(max_bytes(&m).as_deref(), Some("1048576"));
    let (bytes, inodes) = storage_of(m.path(), CHILD);
    assert!(bytes >= 512 << 10, "{bytes}");
    assert!(inodes >= 1, "{inodes}");
    let over = write(&m, "over", 1024);
    assert!(
        !over.ok() && over.stdout.contains("Disk quota exceeded"),
        "{over:?}"
    );

    // Lowered below its use: the data stays, growth is refused, deletion works.
    run_as(m.path(), CHILD, &["rm", "-f", &format!("{private}/over")]).expect_ok("rm");
    patch_config(&m, json!({"limits": {"max_bytes_per_smith": "256K"}}));
    reload_ok(&m);
    assert_eq!(max_bytes(&m).as_deref(), Some("262144"));
    assert_eq!(
        std::fs::metadata(format!("{private}/before"))
            .expect("kept")
            .len(),
        512 << 10
    );
    let grow = write(&m, "grow", 64);
    assert!(
        !grow.ok() && grow.stdout.contains("Disk quota exceeded"),
        "{grow:?}"
    );
    let why = run_as(m.path(), CHILD, &["cat", ".smithfs/why"]).expect_ok("why");
    assert!(why.contains("max_bytes_per_smith"), "{why}");

    // Raised: it may grow again.
    patch_config(&m, json!({"limits": {"max_bytes_per_smith": "4M"}}));
    reload_ok(&m);
    write(&m, "raised", 1024).expect_ok("a write under the raised quota");
    // The counters equal a restart's scan.
    let live = storage_of(m.path(), CHILD);
    let mut m = m;
    m.remount();
    assert_eq!(
        storage_of(m.path(), CHILD),
        live,
        "counters vs a restart's scan"
    );

    // Off: nothing is refused.
    patch_config(
        &m,
        json!({"limits": {"max_bytes_per_smith": null, "max_inodes_per_smith": null}}),
    );
    reload_ok(&m);
    write(&m, "unlimited", 4096).expect_ok("a write with the quota off");
    assert_eq!(max_bytes(&m), None, "no quota shown once it is off");
}

/// v1 `memory.limit_in_bytes` cannot be set below what a cgroup uses when nothing can be
/// reclaimed (no swap: `EBUSY`): a reload lowering `memory_max` below a live run's memory is
/// refused whole, the old limit is written back, `config.reload_failed` is journaled and the run
/// lives on (docs/PROTOCOL-NOTES.md L20). On the v2 backend the kernel accepts such a write and
/// OOM-kills instead, so this runs where `memory` is a v1 hierarchy.
#[test]
fn a_v1_memory_limit_below_use_is_refused_and_rolled_back() {
    if let Some(why) = cgroups_unavailable() {
        eprintln!("skipped: {why}");
        return;
    }
    let m = mount(None);
    let pid = m.daemon_pid().expect("daemon pid");
    patch_config(&m, json!({"limits": {"per_smith": {"memory_max": "256M"}}}));
    reload_ok(&m);
    mkdir(&m, "smiths/smith-root/children/smith-001").expect("child");
    let leaf = limit_dir(pid, Controller::Memory, "smith-root/smith-001", true);
    if !leaf.join("memory.limit_in_bytes").exists() {
        eprintln!("skipped: memory is not a v1 hierarchy here (v2 OOM-kills instead of EBUSY)");
        return;
    }
    if std::fs::read_to_string("/proc/swaps").is_ok_and(|s| s.lines().count() > 1) {
        eprintln!("skipped: swap is on, so the kernel can always reclaim");
        return;
    }
    // A bound process holding 64 MiB of anonymous memory until its stdin closes.
    let mut hog = Command::new(common::SMITHFS)
        .args(["run", "--mount"])
        .arg(m.path())
        .args(["--smith", "smith-root/smith-001", "--", "python3", "-c"])
        .arg("import sys\nb = b'x' * (64 << 20)\nprint('ready', flush=True)\nsys.stdin.read()\nprint(len(b))")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("hog");
    let mut out = std::io::BufReader::new(hog.stdout.take().expect("stdout"));
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).expect("ready line");
    assert_eq!(line, "ready\n");
    patch_config(&m, json!({"limits": {"per_smith": {"memory_max": "8M"}}}));
    let r = reload(&m);
    assert_ne!(r.code, Some(0), "{r:?}");
    assert!(
        r.stderr.contains("the new cgroup limits cannot be applied"),
        "{r:?}"
    );
    assert_eq!(
        read(&leaf, "memory.limit_in_bytes"),
        (256u64 << 20).to_string()
    );
    assert_eq!(events(&m, "config.reload_failed").len(), 1);
    // The hog lived on with all of its memory.
    drop(hog.stdin.take());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).expect("rest");
    assert_eq!(rest, format!("{}\n", 64 << 20));
    assert!(hog.wait().expect("wait").success());
    let st = smithfs([Path::new("status"), m.path()]).expect_ok("status");
    assert!(
        st.contains("memory_max 256M") || st.contains("256M"),
        "{st}"
    );
}
