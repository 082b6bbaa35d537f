//! The `loopback` launcher end to end (docs/SPEC.md §13, docs/PROTOCOL-NOTES.md R12–R15, R30):
//! every run is `smithfs attach` on this host, dialing the daemon's own listener with the run's
//! ticket, and its agent works in attach's own remote mount of the tree — the path a Slurm job
//! takes, without Slurm. Each test has its own mount (`Sm`). The first tests run with the §12
//! sandbox on, which `attach` starts the agent in from the plan the daemon sends (escapes.sh
//! finds nothing; a cancel's TERM reaches the sandboxed agent); the rest test the remote path
//! itself with the sandbox off (their agents record host pids).

use crate::common;

use std::ffi::OsStr;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use common::msched::*;
use common::{poll_until, MountOpts, SMITHFS};
use serde_json::json;

const ROOT: &str = "smith-root";
const C1: &str = "smith-root/smith-001";
const C2: &str = "smith-root/smith-002";
const C3: &str = "smith-root/smith-003";

/// Run before the test agent's own directives: every run records the device its working
/// directory is on (`private/dev`); the directive `trapterm` records its pid and waits, and a
/// TERM makes it write `private/term` (through its mount) and exit 7; `leaveone` publishes and
/// exits, leaving a `sleep` in its process group (`private/bg`); `killself` writes a line to
/// stdout and one to stderr and kills itself with SIGKILL.
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
if [ "$SMITH_WAKE" != children ] && [ "$first" = killself ]; then
  echo "to stdout"
  echo "to stderr" >&2
  kill -KILL $$
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

/// A scheduler mount in identity `mode` with the loopback launcher, the §12 sandbox on (the
/// default; the agents' uid pinned to 65534) and `patch` merged into its config; the test agent
/// runs [`PROLOGUE`] first.
fn sandboxed_loopback(mode: &'static str, patch: serde_json::Value) -> Sm {
    let mut cfg = json!({"launcher": {"kind": "loopback"}, "sandbox": {"uid": 65534}});
    merge(&mut cfg, &patch);
    let s = Sm::with(
        MountOpts {
            allow_other: true,
            extra: vec!["--identity", mode],
            ..MountOpts::default()
        },
        cfg,
    );
    s.write("agents/agent.sh", &format!("{PROLOGUE}{AGENT}"));
    s
}

/// docs/SPEC.md §12, §13 (notes R30): with the sandbox on, a loopback run's agent starts in the
/// sandbox `attach` builds from the daemon's plan — every route of tests/fixtures/escapes.sh
/// fails (the daemon's pid, the host's files and devices, mount, setuid…, and the kernel layers'
/// attacks: an abstract socket of the host, signals outside, the filtered calls; also with
/// `SMITHFS_SANDBOX_WITHOUT` naming every layer in the run's, so `attach`'s, environment), it is the
/// agents' uid (not root) with one group, no capability and `no_new_privs`, under the seccomp
/// filter, it sees only its own processes — and it still works in its own remote mount: its result is published.
fn sandboxed_loopback_runs_let_nothing_escape(mode: &'static str) {
    sandboxed_remote_runs_let_nothing_escape(mode, json!({"kind": "loopback"}), Vec::new());
}

/// [`sandboxed_loopback_runs_let_nothing_escape`] with the launcher `launcher` (`launcher` in
/// config.json) and `env` in the daemon's environment: also the check of a sandboxed run as a
/// Slurm job (tests/e2e/slurm.rs).
pub(crate) fn sandboxed_remote_runs_let_nothing_escape(
    mode: &'static str,
    launcher: serde_json::Value,
    env: Vec<(&'static str, &'static str)>,
) {
    if !is_root() {
        eprintln!("skipped: the sandbox and smithfs attach need root here");
        return;
    }
    let kind = launcher["kind"].as_str().unwrap_or("?").to_string();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/escapes.sh");
    let scratch = tempfile::Builder::new()
        .prefix("smithfs-loopback-sb-")
        .tempdir()
        .expect("tempdir");
    let outside = scratch.path().join("outside.txt");
    std::fs::write(&outside, "world-readable, outside the view\n").expect("outside");
    let hook = scratch.path().join("hook.sh");
    std::fs::write(&hook, "#!/bin/sh\nexit 0\n").expect("hook");
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod hook");
    // An abstract unix socket of this host, outside the run (Landlock's scoping keeps it out).
    let abstract_name = format!("smithfs-loopback-{}-{mode}", std::process::id());
    let abstract_listener = {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(abstract_name.as_bytes())
            .expect("abstract address");
        let l = std::os::unix::net::UnixListener::bind_addr(&addr).expect("bind");
        l.set_nonblocking(true).expect("nonblocking");
        l
    };
    // escapes.sh, then the device the run works on and a result through the remote mount.
    let wrapper =
        r#"/bin/bash "$0"; echo "dev: $(stat -c %d .)"; printf 'sandboxed\n' > outbox/result.md"#;
    let config = json!({
        "launcher": launcher,
        "agent": {
            "command": ["/bin/bash", "-c", wrapper, script],
            // The run's environment is attach's: a layer named here must not come off (the
            // plan is the daemon's word alone, notes R30).
            "env": {
                "SMITHFS_SANDBOX_WITHOUT": "view,landlock,seccomp",
                "SANDBOXED": "1",
                "LAYERS": "1",
                "ABSTRACT": abstract_name,
                "OUTSIDE": outside,
                "SMITHFS_BIN": SMITHFS,
                "AGENT_PROG": script,
                "HOOK_PROG": hook,
            },
            "retries": 0
        },
        "sandbox": {"uid": 65534},
        "hooks": {"run.started": [[hook]]},
    });
    let m = common::TestMount::with_config(&config, mode, env);
    let daemon_dev = std::fs::metadata(m.path().join("smiths/smith-root"))
        .expect("stat")
        .dev();
    std::fs::write(
        m.path().join("smiths/smith-root/inbox/task-1.md"),
        "escape\n",
    )
    .expect("task");
    let (log, meta) = common::ended_run(&m, "smiths/smith-root", 1, 90);
    assert!(meta["error"].is_null(), "[{mode}] {meta}");
    common::check_nothing_escaped(&log, 65534, &format!("{mode}, {kind}"));
    assert!(
        log.contains("Seccomp: 2"),
        "[{mode}] not under the filter:\n{log}"
    );
    assert!(
        matches!(abstract_listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "[{mode}] a run connected to the abstract socket"
    );
    // The daemon's pid was named (and attacked), through the run's own remote mount.
    assert!(log.contains("daemon pid: "), "[{mode}]\n{log}");
    assert!(log.contains("full id: smith-root\n"), "[{mode}]\n{log}");
    let dev = log
        .lines()
        .find_map(|l| l.strip_prefix("dev: "))
        .unwrap_or_else(|| panic!("[{mode}] no dev line:\n{log}"));
    assert_ne!(
        dev,
        daemon_dev.to_string(),
        "[{mode}] the run worked in the daemon's own mount, not its remote one"
    );
    let fin = poll_until(Duration::from_secs(30), "results/final.md", || {
        std::fs::read_to_string(m.path().join("results/final.md")).ok()
    });
    assert_eq!(fin, "sandboxed\n", "[{mode}]");
    assert_eq!(meta["exit_code"], 0, "[{mode}] {meta}");
    assert!(!std::path::Path::new("/etc/smithfs-escape").exists());
}

#[test]
fn sandboxed_loopback_runs_let_nothing_escape_cgroup() {
    sandboxed_loopback_runs_let_nothing_escape("cgroup");
}

#[test]
fn sandboxed_loopback_runs_let_nothing_escape_ancestry() {
    sandboxed_loopback_runs_let_nothing_escape("ancestry");
}

/// A sandboxed agent that ignores TERM is ended by the KILL after `agent.kill_grace_secs`: the
/// KILL ends `attach`, whose death kills the sandbox's init (its parent-death signal, notes
/// XT16, R30), and with it every process of the run's pid namespace — a `setsid` descendant
/// that ignores TERM included.
#[test]
fn sandboxed_loopback_kill_after_the_grace_ends_the_whole_run() {
    if !is_root() {
        eprintln!("skipped: the sandbox and smithfs attach need root here");
        return;
    }
    let s = sandboxed_loopback(
        "cgroup",
        json!({"agent": {"kill_grace_secs": 1, "retries": 0}}),
    );
    let mut left = Leftovers::default();
    s.task("resumehangterm\n");
    let ns_pid = |name: &str| -> i32 {
        s.wait_file(30, &format!("{}/private/{name}", rel(ROOT)))
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("a pid in private/{name}: {e}"))
    };
    let (agent_ns, spid_ns) = (ns_pid("pid"), ns_pid("spid"));
    let attach = s.run_pid(ROOT);
    left.watch(attach);
    let init = poll_until(Duration::from_secs(10), "the sandbox's init", || {
        sandbox_init_of(attach)
    });
    left.watch(init);
    let agent = common::host_pid_in(init, agent_ns).expect("the agent is alive");
    let spid = common::host_pid_in(init, spid_ns).expect("its setsid descendant is alive");
    left.watch(agent);
    left.watch(spid);
    s.cli("cancel", &[ROOT]).expect_ok("smithfs cancel");
    s.wait_events(20, "run.cancelled", Some(ROOT), 1);
    poll_until(
        Duration::from_secs(20),
        "attach, the init, the agent and its descendant to be gone",
        || [attach, init, agent, spid].iter().all(|&p| gone(p)),
    );
    s.wait_state(10, ROOT, "cancelled");
}

/// A sandboxed loopback run whose command cannot start (no such program in the view) ends
/// promptly as a failed run: `attach` stops forwarding and exits non-zero (it never hangs
/// waiting for a COMMAND that never ran), and nothing is left.
#[test]
fn a_sandboxed_loopback_run_whose_command_cannot_start_ends() {
    if !is_root() {
        eprintln!("skipped: the sandbox and smithfs attach need root here");
        return;
    }
    let config = json!({
        "launcher": {"kind": "loopback"},
        "agent": {"command": ["/nonexistent/agent"], "retries": 0},
        "sandbox": {"uid": 65534},
    });
    let m = common::TestMount::with_config(&config, "cgroup", Vec::new());
    std::fs::write(m.path().join("smiths/smith-root/inbox/task-1.md"), "go\n").expect("task");
    let (log, meta) = common::ended_run(&m, "smiths/smith-root", 1, 30);
    assert_ne!(meta["exit_code"], 0, "{meta}\n{log}");
    let pid = i32::try_from(meta["pid"].as_i64().expect("a pid")).expect("pid");
    assert!(gone(pid), "attach outlived its run: {meta}");
}

/// The sandbox's init of a loopback run whose `attach` is `attach` (its child in a pid
/// namespace of its own), by host pid.
fn sandbox_init_of(attach: i32) -> Option<i32> {
    let ns = |pid: i32| std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok();
    let mine = ns(attach)?;
    let children = std::fs::read_dir(format!("/proc/{attach}/task"))
        .ok()?
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .collect::<Vec<_>>()
        .join(" ");
    children
        .split_whitespace()
        .filter_map(|c| c.parse::<i32>().ok())
        .find(|&c| ns(c).is_some_and(|n| n != mine))
}

/// A cancel's TERM to the run's group (whose leader is `attach`) reaches the sandboxed agent
/// (attach forwards it to the sandbox's init, which forwards it to the agent: notes R30); the
/// agent's trap still writes through the remote mount, and nothing of the run is left.
#[test]
fn sandboxed_loopback_cancel_reaches_the_agent() {
    if !is_root() {
        eprintln!("skipped: the sandbox and smithfs attach need root here");
        return;
    }
    let s = sandboxed_loopback(
        "cgroup",
        json!({"agent": {"kill_grace_secs": 5, "retries": 0}}),
    );
    let mut left = Leftovers::default();
    s.task("trapterm\n");
    let ns_pid: i32 = s
        .wait_file(30, &format!("{}/private/pid", rel(ROOT)))
        .trim()
        .parse()
        .expect("a pid in private/pid");
    let attach = s.run_pid(ROOT);
    left.watch(attach);
    let init = poll_until(Duration::from_secs(10), "the sandbox's init", || {
        sandbox_init_of(attach)
    });
    left.watch(init);
    let agent = common::host_pid_in(init, ns_pid).expect("the agent is alive");
    left.watch(agent);
    let uid = std::fs::read_to_string(format!("/proc/{agent}/status"))
        .expect("status")
        .lines()
        .find_map(|l| l.strip_prefix("Uid:").map(str::to_owned))
        .expect("Uid");
    assert_eq!(
        uid.split_whitespace().next(),
        Some("65534"),
        "the agent is not the agents' uid: {uid}"
    );
    s.cli("cancel", &[ROOT]).expect_ok("smithfs cancel");
    s.wait_events(20, "run.cancelled", Some(ROOT), 1);
    poll_until(
        Duration::from_secs(20),
        "attach, the init and the agent to be gone",
        || [attach, init, agent].iter().all(|&p| gone(p)),
    );
    assert_eq!(
        s.read(&format!("{}/private/term", rel(ROOT))).as_deref(),
        Some("TERM\n"),
        "the cancel's TERM reached the sandboxed agent"
    );
    s.wait_state(10, ROOT, "cancelled");
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
    s.check_sibling_refused(C1, C2, "over the remote mount");
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

/// docs/PROTOCOL-NOTES.md R16: COMMAND's stdout and stderr cross the connection into the run's
/// `messages.log` (as a local run's), and its exit report says it was killed by a signal:
/// `run.exited` has `reason` `signal` and `signal` 9, not `attach`'s 128 + 9.
#[test]
fn loopback_output_and_a_signalled_exit_reach_the_log_and_the_journal() {
    if !is_root() {
        eprintln!("skipped: smithfs attach mounts as root only (notes R11)");
        return;
    }
    let s = loopback("cgroup", json!({"agent": {"retries": 0}}));
    s.task("killself\n");
    let ev = s.wait_events(60, "run.exited", Some(ROOT), 1)[0].clone();
    assert_eq!(ev["reason"], "signal", "{ev}");
    assert_eq!(ev["signal"], 9, "{ev}");
    assert!(ev.get("exit_code").is_none_or(|c| c.is_null()), "{ev}");
    let m = &s.metas(ROOT)[0];
    assert_eq!(m["signal"], 9, "{m}");
    let log = s
        .read("smiths/smith-root/conversations/run-0001/messages.log")
        .unwrap_or_default();
    for line in ["to stdout", "to stderr"] {
        assert!(
            log.contains(line),
            "{line:?} missing from messages.log: {log}"
        );
    }
    s.wait_state(20, ROOT, "failed");
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

/// `smithfs attach` as a user who is not root (docs/SPEC.md §13 "a user namespace when not
/// root", notes R32): a non-root daemon's `loopback` runs are each an `attach` of that user,
/// which mounts the remote tree in a user and mount namespace of its own and starts the agent
/// in the §12 sandbox from the daemon's plan — every route of tests/fixtures/escapes.sh (the
/// view and the kernel-enforced layers) fails, the agent is the user's uid (never 0) with no
/// capability, it works in its own remote mount (another device than the daemon's) and its
/// result is published, owned by the user.
#[test]
fn a_non_root_attach_mounts_in_a_user_namespace_and_sandboxes_its_run() {
    let Some((_grant, uid, gid)) = common::user::granted_user() else {
        return;
    };
    // The user's tree (`tmp/m`), with the script and a file outside the view beside it.
    let m = common::user::UserMount::init(uid, gid);
    let script = m.tmp.path().join("escapes.sh");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/escapes.sh"),
        &script,
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let outside = m.tmp.path().join("outside.txt");
    std::fs::write(&outside, "the user's, outside the view\n").unwrap();
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o644)).unwrap();
    let wrapper = r#"/bin/bash "$0"; echo "dev: $(stat -c %d .)"; echo "map: $(cat /proc/self/uid_map)"; echo made > private/made.txt; printf 'rootless attach\n' > outbox/result.md"#;
    let config = serde_json::json!({
        "launcher": { "kind": "loopback" },
        "agent": {
            "command": ["/bin/bash", "-c", wrapper, script],
            "env": {
                "SANDBOXED": "1",
                "LAYERS": "1",
                "OUTSIDE": outside,
                "SMITHFS_BIN": SMITHFS,
                "AGENT_PROG": script,
            },
            "retries": 0
        },
    });
    let cfg = m.path().join("config.json");
    std::fs::write(&cfg, config.to_string()).unwrap();
    std::os::unix::fs::chown(&cfg, Some(uid), Some(gid)).unwrap();
    common::user::smithfs_as(uid, gid, &[OsStr::new("mount"), m.path().as_os_str()])
        .expect_ok("a loopback mount as the user");
    let in_mount = |script: &str| m.sh(script);
    let daemon_dev = in_mount("stat -c %d smiths/smith-root").expect_ok("stat");
    in_mount("printf 'escape\\n' > smiths/smith-root/inbox/task-1.md").expect_ok("task");
    let (log, meta) = m.ended_run("smiths/smith-root", 1, 90);
    assert!(meta["error"].is_null(), "{meta}\n{log}");
    assert_eq!(meta["exit_code"], 0, "{meta}\n{log}");
    assert!(
        !log.contains("ESCAPED") && !log.contains("MISSING"),
        "a run of a non-root attach got out:\n{log}"
    );
    common::check_unprivileged(&log, uid, "non-root attach");
    for line in ["Seccomp: 2", "full id: smith-root\n"] {
        assert!(log.contains(line), "no {line:?}:\n{log}");
    }
    let dev = log
        .lines()
        .find_map(|l| l.strip_prefix("dev: "))
        .unwrap_or_else(|| panic!("no dev line:\n{log}"));
    assert_ne!(
        dev,
        daemon_dev.trim(),
        "the run worked in the daemon's mount, not attach's own\n{log}"
    );
    // Inside, the user's uid maps to itself (the run's namespace, in attach's): never root.
    let map: Vec<&str> = log
        .lines()
        .find_map(|l| l.strip_prefix("map: "))
        .unwrap_or_else(|| panic!("no map line:\n{log}"))
        .split_whitespace()
        .collect();
    let id = uid.to_string();
    assert_eq!(map, [id.as_str(), id.as_str(), "1"], "{log}");
    let fin = poll_until(30, "results/final.md", || {
        let r = in_mount("cat results/final.md");
        r.ok().then_some(r.stdout)
    });
    assert_eq!(fin, "rootless attach\n");
    let owner = in_mount("stat -c %u:%g smiths/smith-root/private/made.txt").expect_ok("stat");
    assert_eq!(owner.trim(), format!("{uid}:{gid}"));
    drop(m);
}
