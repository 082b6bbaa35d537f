//! The `loopback` launcher end to end (docs/SPEC.md §13, docs/PROTOCOL-NOTES.md R12–R15): every
//! run is `smithfs attach` on this host, dialing the daemon's own listener with the run's ticket,
//! and its agent works in attach's own remote mount of the tree — the path a Slurm job takes,
//! without Slurm. Each test has its own mount (`Sm`), with the §12 sandbox off: the mount refuses
//! this kind while the sandbox is enabled, which the first test shows.

use crate::common;

use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt;
use std::process::Command;
use std::time::Duration;

use common::msched::*;
use common::{poll_until, run, smithfs, MountOpts, SMITHFS};
use serde_json::json;

const ROOT: &str = "smith-root";
const C1: &str = "smith-root/smith-001";
const C2: &str = "smith-root/smith-002";
const C3: &str = "smith-root/smith-003";

/// Run before the test agent's own directives: every run records the device its working
/// directory is on (`private/dev`); the directive `trapterm` records its pid and waits, and a
/// TERM makes it write `private/term` (through its mount) and exit 7; `leaveone` publishes and
/// exits, leaving a `sleep` in its process group (`private/bg`).
const PROLOGUE: &str = r#"
stat -c %d . > private/dev
read -r first _ < "$SMITH_TASK_FILE"
if [ "$SMITH_WAKE" != children ] && [ "$first" = trapterm ]; then
  trap 'echo TERM > private/term; exit 7' TERM
  echo $$ > private/pid
  sleep 1000 &
  echo $! > private/gpid
  wait $!
  exit 0
fi
if [ "$SMITH_WAKE" != children ] && [ "$first" = leaveone ]; then
  sleep 1000 &
  echo $! > private/bg
  printf 'left one\n' > private/r.md && mv private/r.md outbox/result.md
  exit 0
fi
"#;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A scheduler mount in identity `mode` with the loopback launcher, the sandbox off and `patch`
/// merged into its config; the test agent runs [`PROLOGUE`] first.
fn loopback(mode: &'static str, patch: serde_json::Value) -> Sm {
    let mut cfg = json!({"launcher": {"kind": "loopback"}});
    merge(&mut cfg, &patch);
    let s = Sm::with(
        MountOpts {
            allow_other: true,
            unsandboxed: true,
            extra: vec!["--identity", mode],
            ..MountOpts::default()
        },
        cfg,
    );
    s.write("agents/agent.sh", &format!("{PROLOGUE}{AGENT}"));
    s
}

/// docs/SPEC.md §13: the loopback kind's runs would start outside the §12 sandbox, so while
/// `sandbox.enabled` is true (the default) the mount is refused in one line naming both keys.
#[test]
fn loopback_is_refused_while_the_sandbox_is_enabled() {
    let dir = tempfile::Builder::new()
        .prefix("smithfs-loopback-")
        .tempdir()
        .expect("tempdir");
    let d = dir.path().join("m");
    smithfs([OsStr::new("init"), d.as_os_str()]).expect_ok("init");
    let c = json!({"launcher": {"kind": "loopback"}});
    std::fs::write(d.join("config.json"), c.to_string()).expect("config.json");
    let r = run(Command::new(SMITHFS)
        .arg("mount")
        .arg(&d)
        .arg("--allow-other"));
    if r.code == Some(0) {
        let _ = smithfs([OsStr::new("umount"), d.as_os_str()]);
        panic!("mounted a loopback launcher with the sandbox enabled: {r:?}");
    }
    assert!(
        r.stderr.contains("launcher.kind")
            && r.stderr.contains("sandbox.enabled")
            && r.stderr.trim().lines().count() == 1,
        "{r:?}"
    );
}

/// Each run's agent works in attach's own remote mount (another device than the daemon's
/// mount at the same path), is judged as its smith there (a sibling's private/ is EACCES for
/// write and read, whoami names it), publishes, and its exit code reaches `run.exited`; every
/// smith's first run is `run-0001`, so the listener tells their tickets apart; what a run left
/// in its process group is gone once it ended.
fn runs_reach_the_tree_through_their_own_remote_mount(mode: &'static str) {
    if !is_root() {
        eprintln!("skipped: smithfs attach mounts as root only (notes R11)");
        return;
    }
    let s = loopback(mode, json!({"agent": {"retries": 0}}));
    let daemon_dev = std::fs::metadata(s.p("smiths/smith-root"))
        .expect("stat")
        .dev();
    s.task("split\nsibling\nfail\nleaveone\n");
    assert_eq!(
        s.wait_file(60, "results/final.md"),
        "result of smith-001\nleft one\n"
    );
    s.wait_state(20, ROOT, "done");
    // What a run left in its group ends with it (`attach` kills it once COMMAND ended).
    let mut left = Leftovers::default();
    // (Unsandboxed: the recorded pid is a host pid.)
    let bg: i32 = s
        .wait_file(20, &format!("{}/private/bg", rel(C3)))
        .trim()
        .parse()
        .expect("a pid in private/bg");
    left.watch(bg);
    poll_until(
        Duration::from_secs(20),
        "the run's leftover to be gone",
        || gone(bg),
    );
    for full in [ROOT, C1, C2, C3] {
        let dev = s.read(&format!("{}/private/dev", rel(full))).unwrap();
        assert_ne!(
            dev.trim(),
            daemon_dev.to_string(),
            "{full}'s run worked in the daemon's own mount, not its remote one"
        );
    }
    let c1 = rel(C1);
    let who = s.read(&format!("{c1}/private/whoami.txt")).unwrap();
    assert!(who.contains("identity: smith"), "{who}");
    assert!(who.contains(&format!("full id: {C1}")), "{who}");
    let sib = s.read(&format!("{c1}/private/sibling.txt")).unwrap();
    assert_eq!(
        sib.matches("Permission denied").count(),
        2,
        "write and read of a sibling's private/ are EACCES over the remote mount: {sib}"
    );
    assert!(
        !s.p(&format!("{}/private/intrusion", rel(C2))).exists(),
        "nothing written into the sibling"
    );
    let denied = s.of("access.denied", Some(C1));
    assert!(denied.len() >= 2, "{denied:?}");
    let exited = |full: &str| s.wait_events(20, "run.exited", Some(full), 1)[0].clone();
    assert_eq!(exited(C1)["exit_code"], 0);
    assert_eq!(exited(C2)["exit_code"], 3);
    assert_eq!(s.state(C2), "failed");
    assert_eq!(strs(&s.metas(ROOT), "wake"), ["task", "children"]);
    // Five runs, five connections, each under its own ticket.
    let log = s.read(".smithfs/daemon.log").unwrap_or_default();
    let accepted: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("remote connection accepted"))
        .collect();
    assert_eq!(accepted.len(), 5, "{log}");
    for key in ["/run-0001", "/run-0002"] {
        assert!(accepted.iter().any(|l| l.contains(key)), "{key}: {log}");
    }
}

#[test]
fn loopback_runs_reach_the_tree_through_their_own_remote_mount_cgroup() {
    runs_reach_the_tree_through_their_own_remote_mount("cgroup");
}

#[test]
fn loopback_runs_reach_the_tree_through_their_own_remote_mount_ancestry() {
    runs_reach_the_tree_through_their_own_remote_mount("ancestry");
}

/// Cancel and timeout signal the run's group, whose leader is `attach`: the TERM reaches the
/// agent (its trap writes through the still-forwarding mount), and the run ends.
#[test]
fn loopback_cancel_and_timeout_reach_the_agent_command() {
    if !is_root() {
        eprintln!("skipped: smithfs attach mounts as root only (notes R11)");
        return;
    }
    let s = loopback(
        "cgroup",
        json!({"agent": {"timeout_secs": 4, "kill_grace_secs": 5, "retries": 0}}),
    );
    let mut left = Leftovers::default();
    s.task("split\ntrapterm\ntrapterm\n");
    let pid = |full: &str, left: &mut Leftovers| {
        let p = [s.recorded_pid(full, "pid"), s.recorded_pid(full, "gpid")];
        p.iter().for_each(|&x| left.watch(x));
        left.watch(s.run_pid(full));
        p
    };
    let one = pid(C1, &mut left);
    let two = pid(C2, &mut left);
    s.cli("cancel", &[C1]).expect_ok("smithfs cancel");
    s.wait_events(20, "run.cancelled", Some(C1), 1);
    poll_until(
        Duration::from_secs(20),
        "the cancelled agent to be gone",
        || one.iter().all(|&p| gone(p)),
    );
    assert_eq!(
        s.read(&format!("{}/private/term", rel(C1))).as_deref(),
        Some("TERM\n"),
        "the cancel's TERM reached the agent"
    );
    s.wait_state(10, C1, "cancelled");
    // The other one runs into its timeout.
    s.wait_events(30, "run.timed_out", Some(C2), 1);
    poll_until(
        Duration::from_secs(20),
        "the timed-out agent to be gone",
        || two.iter().all(|&p| gone(p)),
    );
    assert_eq!(
        s.read(&format!("{}/private/term", rel(C2))).as_deref(),
        Some("TERM\n"),
        "the timeout's TERM reached the agent"
    );
    s.wait_state(10, C2, "failed");
    let m = &s.metas(C2)[0];
    assert_eq!(m["timed_out"], true, "{m}");
}

/// An unmount with a loopback run live stops it as a local one (TERM to its group, which reaches
/// the agent), journals it interrupted, and leaves neither the agent nor a mount behind.
#[test]
fn loopback_unmount_stops_a_live_run() {
    if !is_root() {
        eprintln!("skipped: smithfs attach mounts as root only (notes R11)");
        return;
    }
    let mut s = loopback("ancestry", json!({"agent": {"kill_grace_secs": 5}}));
    let mut left = Leftovers::default();
    s.task("trapterm\n");
    let p = [s.recorded_pid(ROOT, "pid"), s.recorded_pid(ROOT, "gpid")];
    p.iter().for_each(|&x| left.watch(x));
    left.watch(s.run_pid(ROOT));
    s.m.umount();
    assert!(p.iter().all(|&x| gone(x)), "the agent outlived the unmount");
    s.m.mount();
    assert_eq!(
        s.read("smiths/smith-root/private/term").as_deref(),
        Some("TERM\n"),
        "the unmount's TERM reached the agent"
    );
    let exited = s.of("run.exited", Some(ROOT));
    assert_eq!(exited.len(), 1, "{exited:?}");
    assert_eq!(exited[0]["outcome"], "interrupted", "{exited:?}");
}
