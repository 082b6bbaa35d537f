//! Hooks, scheduling, the CLI, status, events and restarts (docs/SPEC.md §5–§9) on real mounts
//! driven by real processes: tasks are written with the tools people use (shell redirection,
//! `cp`, `mv`, `sed -i`, `tee`, an editor's save), the agent is a small sh script in the
//! mount's `agents/` (`common::msched::AGENT`), and everything is observed through the mount, the
//! journal and the CLI. Each test has its own mount (`TestMount`).

use crate::common;

use std::time::{Duration, Instant};

use common::msched::*;
use common::{poll_until, run, sh_in, smithfs, TestMount};
use serde_json::{json, Value};
use std::ffi::OsStr;

const ROOT: &str = "smith-root";
const C1: &str = "smith-root/smith-001";
const C2: &str = "smith-root/smith-002";
const C3: &str = "smith-root/smith-003";

/// Kill probe: is `pid` still a live (non-zombie) process?
fn alive(pid: i32) -> bool {
    !gone(pid)
}

#[test]
fn inbox_write_starts_one_run_with_the_protocol_environment() {
    let s = Sm::new(json!({}));
    s.task("env\n");
    // Visible through the mount at once: poll the mount, with a deadline.
    let fin = s.wait_file(20, "results/final.md");
    assert_eq!(fin, "result of smith-root\n");
    s.wait_state(10, ROOT, "done");

    let started = s.of("run.started", Some(ROOT));
    assert_eq!(started.len(), 1, "one run: {:#?}", s.events());
    assert_eq!(started[0]["wake"], "task");
    assert_eq!(s.of("task.assigned", Some(ROOT)).len(), 1);

    let dir = s.dir();
    let sd = format!("{dir}/smiths/smith-root");
    let envtxt = s.read("smiths/smith-root/private/env.txt").unwrap();
    for want in [
        "SMITH_ID=smith-root".to_string(),
        "SMITH_FULL_ID=smith-root".to_string(),
        "SMITH_LEVEL=0".to_string(),
        "SMITH_PARENT=".to_string(),
        "SMITH_WAKE=task".to_string(),
        format!("SMITH_MOUNT={dir}"),
        format!("SMITH_DIR={sd}"),
        format!("SMITH_TASK_FILE={sd}/inbox/task-1.md"),
    ] {
        assert!(envtxt.lines().any(|l| l == want), "{want} in\n{envtxt}");
    }
    // The run is bound to its smith from its first request.
    let who = s.read("smiths/smith-root/private/whoami.txt").unwrap();
    assert!(who.contains("identity: smith"), "{who}");
    assert!(who.contains("full id: smith-root"), "{who}");

    // meta.json (§5) and status (§7).
    let metas = s.metas(ROOT);
    assert_eq!(metas.len(), 1);
    let m = &metas[0];
    for k in [
        "command",
        "wake",
        "pid",
        "pgid",
        "start",
        "end",
        "exit_code",
    ] {
        assert!(!m[k].is_null(), "meta.json lacks {k}: {m}");
    }
    assert_eq!(m["wake"], "task");
    assert_eq!(m["exit_code"], 0);
    assert_eq!(m["command"][1], format!("{dir}/agents/agent.sh"));
    assert!(ts(&m["end"]) >= ts(&m["start"]));
    let log = s
        .read("smiths/smith-root/conversations/run-0001/messages.log")
        .unwrap_or_default();
    assert!(
        log.contains("run smith-root wake=task"),
        "stdout is in messages.log: {log}"
    );

    let st = s.status();
    assert_eq!(st["agent_configured"], true);
    let r = smith_of(&st, ROOT);
    for k in [
        "full_id",
        "parent",
        "level",
        "state",
        "runs",
        "has_result",
        "last_run",
    ] {
        assert!(r.get(k).is_some(), "status lacks {k}: {r}");
    }
    assert_eq!(r["parent"], Value::Null);
    assert_eq!(r["level"], 0);
    assert_eq!(r["state"], "done");
    assert_eq!(r["runs"], 1);
    assert_eq!(r["has_result"], true);
    let lr = &r["last_run"];
    for k in ["run_id", "wake", "started", "ended", "exit_code", "signal"] {
        assert!(lr.get(k).is_some(), "last_run lacks {k}: {lr}");
    }
    assert_eq!(lr["wake"], "task");
    assert_eq!(lr["exit_code"], 0);
    assert_eq!(lr["signal"], Value::Null);
    ts(&lr["started"]);
    ts(&lr["ended"]);
    assert_eq!(st, s.status_file(), "CLI and .smithfs/status.json agree");

    // The journal (§7): every line has ts (RFC 3339), event, smith; CLI == file.
    let ev = s.events_cli();
    assert_eq!(ev, s.events());
    for e in &ev {
        ts(&e["ts"]);
        assert!(e["event"].is_string(), "{e}");
        assert!(e.get("smith").is_some(), "{e}");
    }
    let names = strs(&ev, "event");
    for want in [
        "task.assigned",
        "run.started",
        "run.exited",
        "result.published",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
    }
    let rs = &s.of("run.started", Some(ROOT))[0];
    assert_eq!(rs["run_id"], "run-0001");
    assert!(rs["pid"].is_number(), "{rs}");
}

#[test]
fn rename_into_the_inbox_starts_a_run() {
    let s = Sm::new(json!({}));
    s.write("smiths/smith-root/private/draft.md", "ok\n");
    s.m.sh_ok("mv smiths/smith-root/private/draft.md smiths/smith-root/inbox/task-7.md");
    assert_eq!(
        s.wait_file(20, "results/final.md"),
        "result of smith-root\n"
    );
    s.wait_state(10, ROOT, "done");
    let assigned = s.of("task.assigned", Some(ROOT));
    assert_eq!(assigned.len(), 1, "{assigned:?}");
    assert_eq!(assigned[0]["path"], "smiths/smith-root/inbox/task-7.md");
    assert_eq!(s.of("run.started", Some(ROOT)).len(), 1);
}

/// The tools people use to put a file in place, each on its own child's inbox: one trigger
/// and one run each. A fence (a task for the root, handled after every earlier trigger in the
/// ordered queue) makes "no second trigger" observable without a blind sleep.
#[test]
fn each_writing_tool_triggers_exactly_once() {
    let s = Sm::new(json!({"limits": {"max_children": 6}}));
    let tools = ["redirect", "tee", "cp", "mv", "editor", "sed"];
    for i in 1..=tools.len() {
        s.m.sh_ok(&format!("mkdir smiths/smith-root/children/smith-{i:03}"));
    }
    let inbox = |i: usize| format!("smiths/smith-root/children/smith-{i:03}/inbox");
    let scratch = s.m.scratch().display().to_string();
    // sed -i edits an existing task: put it there first and let its run finish.
    s.m.sh_ok(&format!("echo ok > {}/task-1.md", inbox(6)));
    let sed = "smith-root/smith-006";
    s.wait_events(20, "run.exited", Some(sed), 1);

    s.m.sh_ok(&format!("echo ok > {}/task-1.md", inbox(1)));
    s.m.sh_ok(&format!("echo ok | tee {}/task-1.md > /dev/null", inbox(2)));
    s.m.sh_ok(&format!(
        "echo ok > {scratch}/cp.md && cp {scratch}/cp.md {}/task-1.md",
        inbox(3)
    ));
    s.m.sh_ok(&format!(
        "echo ok > {scratch}/mv.md && mv {scratch}/mv.md {}/task-1.md",
        inbox(4)
    ));
    // An editor's save: swap file, vim's 4913 probe, backup, write a temp and rename it over
    // the name, drop the swap file.
    s.m.py_ok(
        r#"
import os, sys
d = sys.argv[1]
open(f"{d}/.task-1.md.swp", "w").write("swap")
fd = os.open(f"{d}/4913", os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644); os.close(fd)
os.unlink(f"{d}/4913")
with open(f"{d}/task-1.md~", "w") as f: f.write("old")
with open(f"{d}/task-1.md.tmp", "w") as f:
    f.write("ok\n"); f.flush(); os.fsync(f.fileno())
os.rename(f"{d}/task-1.md.tmp", f"{d}/task-1.md")
os.unlink(f"{d}/.task-1.md.swp")
"#,
        &[&inbox(5)],
    );
    s.m.sh_ok(&format!("sed -i 's/ok/ok again/' {}/task-1.md", inbox(6)));

    for i in 1..=tools.len() {
        let c = format!("smith-root/smith-{i:03}");
        let want = if i == 6 { 2 } else { 1 };
        s.wait_events(20, "run.exited", Some(&c), want);
    }
    // Fence: the root's task is queued after every trigger above.
    s.task("ok\n");
    s.wait_events(20, "run.exited", Some(ROOT), 1);

    let ev = s.events_cli();
    let mut report = Vec::new();
    for (i, tool) in tools.iter().enumerate() {
        let c = format!("smith-root/smith-{:03}", i + 1);
        let want = if *tool == "sed" { 2 } else { 1 };
        let assigned = filter(&ev, "task.assigned", Some(&c));
        let started = filter(&ev, "run.started", Some(&c));
        report.push(format!(
            "{tool}: task.assigned {} run.started {} paths {:?}",
            assigned.len(),
            started.len(),
            strs(&assigned, "path")
        ));
        let ok = assigned.len() == want
            && started.len() == want
            && assigned.iter().all(|a| {
                a["path"]
                    .as_str()
                    .unwrap_or("")
                    .ends_with("/inbox/task-1.md")
            });
        if !ok {
            panic!("{tool} must trigger exactly once:\n{}", report.join("\n"));
        }
    }
    assert!(started_wakes(&ev, "smith-root/smith-005")
        .iter()
        .all(|w| w == "task"));
}

fn started_wakes(ev: &[Value], smith: &str) -> Vec<String> {
    strs(&filter(ev, "run.started", Some(smith)), "wake")
}

#[test]
fn temporary_names_never_trigger() {
    let s = Sm::new(json!({}));
    let inbox = "smiths/smith-root/inbox";
    s.m.sh_ok(&format!(
        "cd {inbox} && echo ok > .task-1.md.swp && echo ok > 4913 && echo ok > task-1.md.tmp \
         && echo ok > .task-2.md && echo ok > task-3.md~ && echo ok > notes.md \
         && mkdir sub && echo ok > sub/task-4.md && mv task-1.md.tmp task-5.md.tmp \
         && cp .task-2.md sub/task-6.md"
    ));
    // Fence: a real task, journaled after anything the writes above might have triggered.
    s.write(&format!("{inbox}/task-9.md"), "ok\n");
    s.wait_events(20, "run.exited", Some(ROOT), 1);
    let assigned = s.of("task.assigned", None);
    assert_eq!(
        strs(&assigned, "path"),
        [format!("{inbox}/task-9.md")],
        "only the real task triggers"
    );
    assert_eq!(s.of("run.started", None).len(), 1);
}

#[test]
fn child_results_wake_the_parent_and_reach_final() {
    let s = Sm::new(json!({}));
    s.task("split\nok\nok\n");
    let fin = s.wait_file(30, "results/final.md");
    assert_eq!(fin, "result of smith-001\nresult of smith-002\n");
    s.wait_state(10, ROOT, "done");
    assert_eq!(
        strs(&s.metas(ROOT), "wake"),
        ["task", "children"],
        "{:#?}",
        s.events()
    );
    assert_eq!(s.of("smith.created", None).len(), 2);
    assert_eq!(s.of("children.settled", Some(ROOT)).len(), 1);
    for c in [C1, C2] {
        assert_eq!(s.state(c), "done");
        assert_eq!(s.of("run.started", Some(c)).len(), 1);
        let env = s.read(&format!("{}/outbox/result.md", rel(c))).unwrap();
        assert!(env.starts_with("result of"), "{env}");
    }
    let exits = s.of("run.exited", Some(ROOT));
    assert_eq!(strs(&exits, "outcome"), ["waiting", "done"]);
}

#[test]
fn children_settling_while_the_parent_runs_wake_it_after_it_exits() {
    let s = Sm::new(json!({}));
    s.task("splitwait\nok\n");
    let fin = s.wait_file(30, "results/final.md");
    assert_eq!(fin, "result of smith-001\n");
    s.wait_state(10, ROOT, "done");
    assert!(
        s.read("smiths/smith-root/private/settled-before-exit")
            .is_some(),
        "the child settled while the parent's first run was live"
    );
    let metas = s.metas(ROOT);
    assert_eq!(strs(&metas, "wake"), ["task", "children"]);
    assert!(
        ts(&metas[1]["start"]) >= ts(&metas[0]["end"]),
        "woken after it exits: {metas:?}"
    );
    let exits = s.of("run.exited", Some(ROOT));
    let outcomes = strs(&exits, "outcome");
    assert!(
        !outcomes.iter().any(|o| o == "failed" || o == "retry"),
        "never failed: {outcomes:?}"
    );
    assert_eq!(outcomes.last().map(String::as_str), Some("done"));
    assert_eq!(s.of("run.started", Some(ROOT)).len(), 2);
}

#[test]
fn max_concurrent_is_never_exceeded() {
    let s = Sm::new(json!({"scheduler": {"max_concurrent": 2}}));
    s.task("split\nsleep 0.3\nsleep 0.3\nsleep 0.3\nsleep 0.3\nsleep 0.3\n");
    s.wait_file(40, "results/final.md");
    s.wait_state(10, ROOT, "done");
    let mut spans = Vec::new();
    let mut runs = Vec::new();
    for full in
        std::iter::once(ROOT.to_string()).chain((1..=5).map(|i| format!("smith-root/smith-{i:03}")))
    {
        for m in s.metas(&full) {
            spans.push((ts(&m["start"]), ts(&m["end"])));
            runs.push((full.clone(), m["wake"].clone()));
        }
    }
    assert_eq!(
        spans.len(),
        7,
        "root twice, five children once: {runs:?}\njournal: {}",
        serde_json::Value::Array(s.events())
    );
    let mut points: Vec<(f64, i32)> = spans
        .iter()
        .flat_map(|(a, b)| [(*a, 1), (*b, -1)])
        .collect();
    points.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)));
    let (mut cur, mut max) = (0, 0);
    for (_, d) in points {
        cur += d;
        max = max.max(cur);
    }
    assert!(max <= 2, "at most 2 runs at once, saw {max}: {spans:?}");
    assert_eq!(max, 2, "the limit is used");
    // Queued FIFO: the children start in the order their tasks were assigned.
    let ev = s.events();
    let kids = |name: &str| -> Vec<String> {
        strs(&filter(&ev, name, None), "smith")
            .into_iter()
            .filter(|x| x != ROOT)
            .collect()
    };
    assert_eq!(kids("run.started"), kids("task.assigned"));
}

#[test]
fn timeout_kills_the_whole_group_including_a_setsid_descendant() {
    let s = Sm::new(json!({"agent": {"timeout_secs": 3, "kill_grace_secs": 1, "retries": 0}}));
    s.task("hang\n");
    let mut left = Leftovers::default();
    let [pid, gpid, spid] = left.hang(&s, ROOT);
    assert!(alive(pid) && alive(gpid) && alive(spid));
    // wait: 124 while the run hangs.
    let w = s.cli("wait", &["--timeout", "0.5"]);
    assert_eq!(w.code, Some(124), "wait --timeout: {w:?}");
    let t = s.wait_events(20, "run.timed_out", Some(ROOT), 1);
    assert_eq!(t.len(), 1);
    // Journaled once the group is gone: both are gone already.
    assert!(gone(pid), "the run's leader {pid} survived its timeout");
    assert!(
        gone(gpid),
        "a member {gpid} of the run's group survived its timeout"
    );
    assert!(
        gone(spid),
        "the setsid descendant {spid} (ignores TERM) survived its run's timeout"
    );
    s.wait_state(10, ROOT, "failed");
    let m = &s.metas(ROOT)[0];
    assert_eq!(m["timed_out"], true, "{m}");
    assert!(m["signal"].is_number(), "{m}");
    assert_eq!(s.cli("wait", &["--timeout", "5"]).code, Some(1));
    // The smith's cgroup was SIGKILLed: its next run is still created (and bound) there.
    s.write("smiths/smith-root/inbox/task-2.md", "env\n");
    assert_eq!(
        s.wait_file(20, "results/final.md"),
        "result of smith-root\n"
    );
    let who = s.read("smiths/smith-root/private/whoami.txt").unwrap();
    assert!(who.contains("full id: smith-root"), "{who}");
    assert_eq!(s.metas(ROOT)[1]["exit_code"], 0);
}

#[test]
fn failing_run_is_retried_then_failed_and_the_parent_still_woken() {
    let s = Sm::new(json!({"agent": {"retries": 1}}));
    s.task("split\nfail\nok\n");
    let fin = s.wait_file(30, "results/final.md");
    assert_eq!(fin, "result of smith-002\n");
    s.wait_state(10, ROOT, "done");
    assert_eq!(s.state(C1), "failed");
    let exits = s.of("run.exited", Some(C1));
    assert_eq!(strs(&exits, "outcome"), ["retry", "failed"]);
    assert_eq!(exits[0]["exit_code"], 3);
    assert_eq!(strs(&s.metas(C1), "wake"), ["task", "retry"]);
    assert_eq!(smith_of(&s.status(), C1)["runs"], 2);
    assert_eq!(strs(&s.metas(ROOT), "wake"), ["task", "children"]);
    // wait: 1 for a failed smith, 0 for the final result and a done one.
    assert_eq!(
        s.cli("wait", &["--smith", C1, "--timeout", "5"]).code,
        Some(1)
    );
    assert_eq!(
        s.cli("wait", &["--smith", C2, "--timeout", "5"]).code,
        Some(0)
    );
    assert_eq!(s.cli("wait", &["--final", "--timeout", "5"]).code, Some(0));
    assert_eq!(s.cli("wait", &["--timeout", "5"]).code, Some(0));
    // §9: states are rebuilt on mount (failed from the journal, done from the result), and
    // nothing runs again.
    let mut s = s;
    s.m.remount();
    // (status.json is empty until the scheduler's first publication: see
    // `status_lists_the_tree_as_soon_as_mount_returns`.)
    s.wait_state(10, C1, "failed");
    assert_eq!(s.state(C2), "done");
    assert_eq!(s.state(ROOT), "done");
    assert_eq!(
        s.of("run.started", None).len(),
        5,
        "nothing re-run after the restart"
    );
}

#[test]
fn cancel_stops_the_subtree_and_settles_it() {
    let s = Sm::new(json!({}));
    s.task("split\nhang\nok\n");
    let mut left = Leftovers::default();
    let [pid, gpid, spid] = left.hang(&s, C1);
    s.cli("cancel", &[C1]).expect_ok("smithfs cancel");
    poll_until(
        Duration::from_secs(20),
        "the cancelled run to be gone",
        || gone(pid) && gone(gpid) && gone(spid),
    );
    s.wait_events(20, "run.cancelled", Some(C1), 1);
    s.wait_state(10, C1, "cancelled");
    assert_eq!(
        s.cli("wait", &["--smith", C1, "--timeout", "5"]).code,
        Some(1)
    );
    // Cancelled counts as settled: the parent is woken and publishes.
    assert_eq!(s.wait_file(30, "results/final.md"), "result of smith-002\n");
    assert_eq!(strs(&s.metas(ROOT), "wake"), ["task", "children"]);
    assert_eq!(s.of("run.started", Some(C1)).len(), 1, "not retried");
}

/// §3: the operator may rename a smith dir only while no run in its subtree is live — EBUSY
/// otherwise, as for `rm -rf` — and then it moves (docs/PROTOCOL-NOTES.md, C35). Moved into
/// a `children/`, it is shown under its new full id with its state from its files.
#[test]
fn smith_dir_move_is_ebusy_while_a_run_in_its_subtree_is_live() {
    const C11: &str = "smith-root/smith-001/smith-001";
    let s = Sm::new(json!({"agent": {"kill_grace_secs": 1}}));
    std::fs::create_dir(s.p(&rel(C1))).expect("mkdir C1");
    std::fs::create_dir(s.p(&rel(C11))).expect("mkdir C11");
    s.write(&format!("{}/inbox/task-1.md", rel(C11)), "hang\n");
    let mut left = Leftovers::default();
    let [pid, gpid, spid] = left.hang(&s, C11);
    let mv = |from: &str, to: &str| -> String {
        let code = "import errno, os, sys\n\
                    try:\n    os.rename(sys.argv[1], sys.argv[2]); print('ok')\n\
                    except OSError as e:\n    print(errno.errorcode[e.errno])";
        s.m.py_ok(code, &[from, to]).trim().to_string()
    };
    for (from, to) in [
        (rel(C11), "smiths/smith-root/private/c11"),
        (rel(C1), "smiths/smith-root/private/c1"),
        (rel(C1), "smiths/smith-root/children/smith-005"),
    ] {
        assert_eq!(mv(&from, to), "EBUSY", "{from} -> {to} while {C11} runs");
    }
    let why = s.read(".smithfs/why").unwrap_or_default();
    assert!(why.contains("rule: structure-live-run"), "{why}");
    assert!(why.contains(&format!("smithfs cancel {C1}")), "{why}");
    // Once the run is gone and C1, woken for its settled child, has published and exited,
    // nothing in C1's subtree is live: the move goes through.
    s.cli("cancel", &[C11]).expect_ok("smithfs cancel");
    poll_until(
        Duration::from_secs(20),
        "the cancelled run to be gone",
        || gone(pid) && gone(gpid) && gone(spid),
    );
    s.wait_events(20, "run.exited", Some(C1), 1);
    s.wait_state(20, C1, "done");
    assert_eq!(mv(&rel(C1), "smiths/smith-root/children/smith-005"), "ok");
    let moved = "smith-root/smith-005";
    let moved_child = "smith-root/smith-005/smith-001";
    assert_eq!(s.state(moved), "done", "{}", s.status_file());
    assert_eq!(s.state(moved_child), "idle", "{}", s.status_file());
    assert_eq!(s.state(C1), "", "the old id is gone: {}", s.status_file());
    assert_eq!(s.of("smith.created", Some(moved)).len(), 1);
    assert_eq!(s.of("smith.created", Some(moved_child)).len(), 1);
    assert!(
        s.of("run.started", Some(moved)).is_empty(),
        "the move starts no run"
    );
}

/// SIGKILL the daemon of `s` (found with `pgrep -f "smithfs mount DIR "`) and wait for it to
/// die; its cgroup tree is removed when `left` drops.
fn kill_daemon(s: &Sm, left: &mut Leftovers) {
    let dir = s.dir();
    let pg = common::run(
        std::process::Command::new("pgrep").args(["-f", &format!("smithfs mount {dir} ")]),
    );
    let found: Vec<i32> = pg
        .stdout
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    assert_eq!(
        found,
        [common::find_daemon(s.m.path()).expect("daemon")],
        "{pg:?}"
    );
    let daemon = found[0];
    // The daemon's cgroup tree (parent of the run's cgroup) outlives it: clean it up after.
    let started = s.wait_events(10, "run.started", Some(ROOT), 1);
    if let Some(cg) = started[0]["cgroup"].as_str() {
        // `…/smithfs-PID/smith-root/self`: the tree is the `smithfs-PID` ancestor.
        if let Some(parent) = std::path::Path::new(cg).ancestors().find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("smithfs-"))
        }) {
            left.cgroup(parent.to_path_buf());
        }
    }
    // SAFETY: SIGKILL to the daemon this test's mount started.
    assert_eq!(unsafe { libc::kill(daemon, libc::SIGKILL) }, 0);
    poll_until(Duration::from_secs(10), "the daemon to die", || {
        gone(daemon)
    });
}

/// Start a `resumehang` run, SIGKILL the daemon (found with `pgrep -f "smithfs mount DIR"`),
/// check the mount fails closed, wait until the mount point itself reports the dead mount (see
/// `umount_right_after_the_daemon_died_detaches_the_dead_mount` for why), check that a plain
/// mount refuses and names `smithfs umount`, then `smithfs umount` and `mount --resume`.
/// Returns the leftover run's [leader, group member, setsid descendant].
fn kill_daemon_then_resume(s: &Sm, left: &mut Leftovers, directive: &str) -> [i32; 3] {
    s.task(&format!("{directive}\n"));
    let pids = left.hang(s, ROOT);
    // Sandboxed, the run's pid is its init's, not the agent's (read while the mount is live).
    let sandboxed = s.run_pid(ROOT) != pids[0];
    let dir = s.dir();
    kill_daemon(s, left);
    // Fail closed while dead: a new lookup and an open get ENOTCONN.
    let e = std::fs::metadata(s.p("smiths/never-looked-up")).expect_err("dead mount: lookup");
    assert_eq!(e.raw_os_error(), Some(libc::ENOTCONN), "{e}");
    let e = std::fs::File::open(s.p("config.json")).expect_err("dead mount: open");
    assert_eq!(e.raw_os_error(), Some(libc::ENOTCONN), "{e}");
    if !sandboxed {
        assert!(pids.iter().all(|&p| alive(p)), "the leftovers still run");
    } else {
        // A sandboxed run dies with its daemon: its init has the parent-death signal (§6, §12).
        poll_until(
            Duration::from_secs(10),
            "the sandboxed run to die with its daemon",
            || pids.iter().all(|&p| gone(p)),
        );
    }
    poll_until(
        Duration::from_secs(10),
        "the mount point to report ENOTCONN",
        || std::fs::metadata(s.m.path()).is_err(),
    );
    let r = smithfs(["mount", dir.as_str(), "--allow-other"]);
    assert_ne!(r.code, Some(0), "mount over a dead mount: {r:?}");
    assert!(
        r.stderr.contains("dead") && r.stderr.contains("smithfs umount"),
        "{}",
        r.stderr
    );
    smithfs(["umount", dir.as_str()]).expect_ok("umount of a dead mount");
    smithfs(["mount", dir.as_str(), "--allow-other", "--resume"]).expect_ok("mount --resume");
    pids
}

#[test]
fn killed_daemon_leftovers_are_killed_on_remount_and_resume_finishes() {
    let s = Sm::new(json!({"agent": {"kill_grace_secs": 1}}));
    let mut left = Leftovers::default();
    let [pid, gpid, _] = kill_daemon_then_resume(&s, &mut left, "resumehang");
    poll_until(
        Duration::from_secs(20),
        "the leftover group to be killed",
        || gone(pid) && gone(gpid),
    );
    let intr = s.wait_events(20, "run.interrupted", Some(ROOT), 1);
    assert_eq!(intr[0]["run_id"], "run-0001");
    assert_eq!(s.wait_file(30, "results/final.md"), "resumed smith-root\n");
    s.wait_state(10, ROOT, "done");
    let metas = s.metas(ROOT);
    assert_eq!(
        strs(&metas, "wake"),
        ["task", "task"],
        "re-queued with its wake"
    );
    let started = s.of("run.started", Some(ROOT));
    let interrupted_at = ts(&intr[0]["ts"]);
    assert!(
        ts(&started[1]["ts"]) >= interrupted_at,
        "leftovers are killed before any run starts"
    );
}

/// §6 `--resume` re-queues an interrupted run also when its smith already has a result from an
/// earlier task: the new task's run was interrupted, so the old result is stale.
#[test]
fn resume_reruns_an_interrupted_run_of_a_smith_with_an_older_result() {
    let s = Sm::new(json!({"agent": {"kill_grace_secs": 1}}));
    s.task("ok\n");
    s.wait_file(30, "results/final.md");
    s.wait_state(10, ROOT, "done");
    s.write("smiths/smith-root/inbox/task-2.md", "resumehang\n");
    let mut left = Leftovers::default();
    left.hang(&s, ROOT);
    let dir = s.dir();
    smithfs(["umount", dir.as_str()]).expect_ok("umount with a live run");
    smithfs(["mount", dir.as_str(), "--allow-other", "--resume"]).expect_ok("mount --resume");
    s.wait_events(10, "run.interrupted", Some(ROOT), 1);
    poll_until(Duration::from_secs(30), "the re-run's result", || {
        s.read("smiths/smith-root/outbox/result.md")
            .is_some_and(|r| r == "resumed smith-root\n")
    });
    s.wait_state(10, ROOT, "done");
}

/// §6 "kills what is left of runs … (by cgroup or process group)": the run was recorded with
/// its cgroup (`run.started` has `cgroup`), so a `setsid` descendant is part of what is left.
#[test]
fn killed_daemon_leftover_setsid_descendant_is_killed_on_remount() {
    // Unsandboxed: a sandboxed run does not outlive its daemon (see kill_daemon_then_resume).
    let s = Sm::new(json!({"agent": {"kill_grace_secs": 1}, "sandbox": {"enabled": false}}));
    let mut left = Leftovers::default();
    let [pid, _, spid] = kill_daemon_then_resume(&s, &mut left, "resumehang");
    s.wait_events(20, "run.interrupted", Some(ROOT), 1);
    poll_until(
        Duration::from_secs(10),
        "the leftover leader to be killed",
        || gone(pid),
    );
    poll_until(
        Duration::from_secs(10),
        "the leftover setsid descendant (in the run's cgroup) to be killed",
        || gone(spid),
    );
}

/// §7, §9: once `mount` returns, `status` shows the tree rebuilt from the files. While the
/// scheduler kills a dead daemon's leftovers (here a group that ignores TERM, so up to
/// `kill_grace_secs`), `status.json` already shows the journal's history.
#[test]
fn status_lists_the_tree_as_soon_as_mount_returns() {
    let s = Sm::new(json!({"agent": {"kill_grace_secs": 3}}));
    let mut left = Leftovers::default();
    kill_daemon_then_resume(&s, &mut left, "resumehangterm");
    let st = s.status();
    let found = st["smiths"]
        .as_array()
        .is_some_and(|a| a.iter().any(|x| x["full_id"] == ROOT && x["runs"] == 1));
    assert!(
        found,
        "right after mount --resume, smith-root with its one run: {st}"
    );
}

/// §6: a dead mount is an error with one clear line, and `umount` clears it; §9: while the
/// daemon is dead the mount fails closed. Right after the kill (within the kernel's 1 s
/// attribute cache of the mount root) `smithfs` still takes the mount for live.
#[test]
fn umount_right_after_the_daemon_died_detaches_the_dead_mount() {
    let s = Sm::new(json!({}));
    s.task("hang\n");
    let mut left = Leftovers::default();
    left.hang(&s, ROOT);
    let dir = s.dir();
    kill_daemon(&s, &mut left);
    let r = smithfs(["mount", dir.as_str(), "--allow-other"]);
    assert_ne!(r.code, Some(0));
    assert!(
        r.stderr.contains("dead"),
        "mount names the dead mount: {}",
        r.stderr
    );
    smithfs(["umount", dir.as_str()]).expect_ok("umount of a dead mount (a leftover run inside)");
    assert!(!common::is_smithfs_mounted(s.m.path()));
    smithfs(["mount", dir.as_str(), "--allow-other"]).expect_ok("mount again");
}

#[test]
fn malformed_smith_config_fails_that_run_not_the_mount() {
    let s = Sm::new(json!({"agent": {"retries": 0}}));
    s.task("split\nbadkey\nbadjson\nbadscope\nok\n");
    let fin = s.wait_file(30, "results/final.md");
    assert_eq!(fin, "result of smith-004\n");
    s.wait_state(10, ROOT, "done");
    let expect = [(C1, "agent.comand"), (C2, "config.json"), (C3, "scheduler")];
    for (c, key) in expect {
        assert_eq!(s.state(c), "failed", "{c}");
        let exits = s.of("run.exited", Some(c));
        assert_eq!(exits.len(), 1, "{c}: {exits:?}");
        let err = exits[0]["error"].as_str().unwrap_or("");
        assert!(
            err.contains(&format!("{}/config.json", rel(c))) && err.contains(key),
            "{c}: the journal names the file and `{key}`: {exits:?}"
        );
        assert_eq!(exits[0]["outcome"], "failed");
        let log = s
            .read(&format!("{}/conversations/run-0001/messages.log", rel(c)))
            .unwrap_or_default();
        assert!(
            log.contains(key),
            "{c}: the reason is in the run log: {log}"
        );
    }
    // The mount lives on: status works, new work runs.
    assert_eq!(s.status()["agent_configured"], true);
    s.write("smiths/smith-root/inbox/task-2.md", "ok\n");
    s.wait_events(20, "run.exited", Some(ROOT), 3);
}

#[test]
fn runs_are_bound_to_their_smith() {
    let s = Sm::new(json!({}));
    s.task("split\nsibling\nok\n");
    s.wait_file(30, "results/final.md");
    s.check_sibling_refused(C1, C2, "local runs");
    let c1 = rel(C1);
    let why = s.read(&format!("{c1}/private/why.txt")).unwrap();
    assert!(why.contains("smith-002/private"), "{why}");
    let denied = s.of("access.denied", Some(C1));
    assert!(denied.len() >= 2, "{denied:?}");
    assert!(denied.iter().all(|d| d["path"]
        .as_str()
        .unwrap_or("")
        .contains("smith-002/private")));
}

#[test]
fn user_hooks_get_the_event_and_never_delay_runs() {
    let s = Sm::new(json!({
        "hook_timeout_secs": 3,
        "hooks": {
            "result.published": [
                ["sh", "-c", "cat > {mount}/../hook-{smith_id}.json; cat {mount}/.smithfs/whoami > {mount}/../hookwho-{smith_id}.txt"],
                ["sh", "-c", "exit 7"],
                ["sleep", "1000"]
            ],
            "run.started": [["sleep", "1000"]]
        }
    }));
    let scratch = s.m.scratch().display().to_string();
    let t0 = Instant::now();
    s.task("split\nok\n");
    assert_eq!(s.wait_file(30, "results/final.md"), "result of smith-001\n");
    s.wait_state(10, ROOT, "done");
    let runs_done = t0.elapsed();

    let hook_json = poll_file(&format!("{scratch}/hook-smith-001.json"));
    let v: Value = serde_json::from_str(hook_json.trim()).expect("event JSON on stdin");
    assert_eq!(v["event"], "result.published");
    assert_eq!(v["smith"], C1);
    assert_eq!(v["path"], format!("{}/outbox/result.md", rel(C1)));
    ts(&v["ts"]);
    let who = poll_file(&format!("{scratch}/hookwho-smith-001.txt"));
    assert!(
        who.contains("identity: operator"),
        "bound as the operator: {who}"
    );

    // result.published ×2 (child, root) × 3 hooks + run.started ×3 × 1 hook.
    let hx = s.wait_events(20, "hook.exited", None, 9);
    let failing: Vec<_> = hx.iter().filter(|h| h["exit_code"] == 7).collect();
    assert_eq!(failing.len(), 2, "{hx:?}");
    let timed_out: Vec<_> = hx.iter().filter(|h| h["timed_out"] == true).collect();
    assert_eq!(timed_out.len(), 5, "{hx:?}");
    assert!(timed_out
        .iter()
        .all(|h| h["hook_event"] == "result.published" || h["hook_event"] == "run.started"));
    // No run waited for a hook: every run ended before the first hook timed out (journal
    // order: lines are appended as things happen; a hook.exited line's `ts` is not its exit).
    let ev = s.events();
    let last_exit = ev
        .iter()
        .rposition(|e| e["event"] == "run.exited")
        .expect("run.exited");
    let first_timeout = ev
        .iter()
        .position(|e| e["event"] == "hook.exited" && e["timed_out"] == true)
        .expect("timed-out hook");
    assert!(
        last_exit < first_timeout,
        "runs finished ({runs_done:?}) before any hook timed out: {ev:#?}"
    );
    assert_eq!(s.of("run.started", None).len(), 3);
}

/// Poll (bounded) for a file outside the mount ending in a newline.
fn poll_file(path: &str) -> String {
    let mut got = String::new();
    poll_until(Duration::from_secs(20), path, || {
        got = std::fs::read_to_string(path).unwrap_or_default();
        got.ends_with('\n')
    });
    got
}

/// Hook latency: `close()` returning in the writer → the agent's first instruction
/// (`date +%s%N`). 50 sequential samples, p50/p99 printed; no timed assertion.
#[test]
fn hook_latency_close_to_first_instruction() {
    let s = Sm::new(json!({"agent": {"command": ["sh", "-c",
        "date +%s%N >> private/lat; echo ok > outbox/result.md"]}}));
    let out = s.m.py_ok(
        r#"
import json, os, sys, time
root = "smiths/smith-root"
lat = []
def status():
    try:
        d = json.load(open(".smithfs/status.json"))
    except (OSError, ValueError):
        return None
    return next(x for x in d["smiths"] if x["full_id"] == "smith-root")
for i in range(50):
    fd = os.open(f"{root}/inbox/task-{i}.md", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, b"ok\n")
    os.close(fd)
    t = time.time_ns()
    end = time.time() + 20
    while True:
        try:
            lines = open(f"{root}/private/lat").read().split()
        except FileNotFoundError:
            lines = []
        if len(lines) > i:
            break
        if time.time() > end:
            sys.exit(f"sample {i}: no run")
        time.sleep(0.0005)
    lat.append(int(lines[i]) - t)
    while True:
        st = status()
        if st and st["runs"] == i + 1 and st["state"] == "done":
            break
        if time.time() > end:
            sys.exit(f"sample {i}: run did not end: {st}")
        time.sleep(0.001)
lat.sort()
p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]
print(f"{p(0.5) / 1e6:.2f} {p(0.99) / 1e6:.2f} {lat[0] / 1e6:.2f} {lat[-1] / 1e6:.2f}")
"#,
        &[],
    );
    let v: Vec<&str> = out.split_whitespace().collect();
    println!(
        "hook latency close() -> agent's first instruction, 50 samples: p50 {} ms, p99 {} ms (min {}, max {})",
        v[0], v[1], v[2], v[3]
    );
    assert_eq!(s.of("run.started", Some(ROOT)).len(), 50);
}

#[test]
fn tasks_arriving_during_a_run_coalesce_into_one_pending_run() {
    let s = Sm::new(json!({}));
    s.write("smiths/smith-root/inbox/task-1.md", "sleep 1\n");
    s.wait_state(20, ROOT, "running");
    for i in 2..=4 {
        s.write(&format!("smiths/smith-root/inbox/task-{i}.md"), "ok\n");
    }
    s.wait_events(20, "run.exited", Some(ROOT), 2);
    s.wait_state(10, ROOT, "done");
    // Fence: one more task, then exactly one more run.
    s.write("smiths/smith-root/inbox/task-5.md", "ok\n");
    s.wait_events(20, "run.exited", Some(ROOT), 3);
    let assigned = s.of("task.assigned", Some(ROOT));
    assert_eq!(
        strs(&assigned, "path"),
        (1..=5)
            .map(|i| format!("smiths/smith-root/inbox/task-{i}.md"))
            .collect::<Vec<_>>(),
        "{assigned:#?}"
    );
    let started = s.of("run.started", Some(ROOT));
    assert_eq!(
        started.len(),
        3,
        "one running + one coalesced pending run: {started:?}"
    );
    // The pending run sees the newest task.
    let log = s
        .read("smiths/smith-root/conversations/run-0002/messages.log")
        .unwrap_or_default();
    assert!(
        log.contains("inbox/task-4.md"),
        "SMITH_TASK_FILE is the newest task: {log}"
    );
}

#[test]
fn umount_stops_live_runs_and_mount_runs_work_that_never_ran() {
    let s = Sm::new(json!({"agent": {"kill_grace_secs": 1}}));
    let mut left = Leftovers::default();
    s.task("hang\n");
    let [pid, gpid, spid] = left.hang(&s, ROOT);
    let mut s = s;
    s.m.umount();
    assert!(
        gone(pid) && gone(gpid) && gone(spid),
        "umount stops the run's whole cgroup"
    );
    // While unmounted: the interrupted run is journaled, and a task lands in a child's inbox
    // in the backing store.
    let journal =
        std::fs::read_to_string(s.p(".smithfs-state/events.jsonl")).expect("journal in the store");
    assert!(
        journal.lines().any(|l| l.contains("\"run.interrupted\"")),
        "{journal}"
    );
    std::fs::create_dir_all(s.p("smiths/smith-root/children")).unwrap();
    s.m.mount();
    s.m.sh_ok("mkdir smiths/smith-root/children/smith-001");
    s.m.umount();
    std::fs::write(s.p(&format!("{}/inbox/task-1.md", rel(C1))), "ok\n").unwrap();
    s.m.mount();
    // Never-run work runs; the interrupted root run is not re-queued without --resume.
    assert_eq!(
        s.wait_file(20, &format!("{}/outbox/result.md", rel(C1))),
        "result of smith-001\n"
    );
    s.wait_state(10, C1, "done");
    assert_eq!(s.of("run.started", Some(C1)).len(), 1);
    // The root is woken by its settled child, but its interrupted task run is not re-queued
    // without --resume.
    s.wait_events(20, "run.exited", Some(ROOT), 2);
    assert_eq!(
        started_wakes(&s.events(), ROOT),
        ["task", "children"],
        "not resumed without --resume"
    );
}

#[test]
fn bad_mount_config_is_refused_with_the_key_path() {
    let mut s = Sm::new(json!({}));
    let good = s.read("config.json").unwrap();
    s.m.umount();
    let cfg = s.p("config.json");
    for (text, key) in [
        (
            r#"{"scheduler": {"max_concurent": 2}}"#,
            "scheduler.max_concurent",
        ),
        (r#"{"agent": {"command": ["sh", "{bogus}"]}}"#, "bogus"),
        (
            r#"{"scheduler": {"max_concurrent": "2"}}"#,
            "scheduler.max_concurrent",
        ),
    ] {
        std::fs::write(&cfg, text).unwrap();
        let r = s.cli("mount", &["--allow-other"]);
        assert_ne!(r.code, Some(0), "{text}: {r:?}");
        assert!(
            r.stderr.contains(key),
            "{text}: the message names {key}: {}",
            r.stderr
        );
        assert_eq!(
            r.stderr.trim().lines().count(),
            1,
            "one clear line: {}",
            r.stderr
        );
        assert!(!common::is_smithfs_mounted(s.m.path()));
    }
    std::fs::write(&cfg, good).unwrap();
    s.m.mount();
}

/// cgroup mode: a run is created in its smith's cgroup and a hook in the `operator` cgroup
/// (`clone3(CLONE_INTO_CGROUP)`), so both are bound from their first instruction.
#[test]
fn runs_and_hooks_are_born_in_their_cgroups() {
    let s = Sm::new(json!({
        "agent": {"command": ["sh", "-c",
            "cat /proc/self/cgroup > private/cg.txt; echo ok > outbox/result.md"]},
        "hooks": {"run.started": [["sh", "-c",
            "cat /proc/self/cgroup > {mount}/../hook-cg.txt; cat {mount}/.smithfs/whoami > {mount}/../hook-who.txt"]]}
    }));
    s.task("ok\n");
    s.wait_state(20, ROOT, "done");
    let meta = &s.metas(ROOT)[0];
    let Some(cgroup) = meta["cgroup"].as_str() else {
        eprintln!("skipped: this mount is not in cgroup mode (no cgroups here)");
        return;
    };
    let cg = s
        .read("smiths/smith-root/private/cg.txt")
        .unwrap_or_default();
    let v2 = |text: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix("0::"))
            .unwrap_or("?")
            .to_string()
    };
    let rel = v2(&cg);
    let rel = rel.as_str();
    assert!(
        cgroup.ends_with(rel) && rel.ends_with("/smith-root/self"),
        "the run is in its smith's cgroup (the `self` leaf of its node) {cgroup}: {cg}"
    );
    let scratch = s.m.scratch().display().to_string();
    let hook_cg = poll_file(&format!("{scratch}/hook-cg.txt"));
    let parent = std::path::Path::new(cgroup)
        .parent()
        .and_then(std::path::Path::parent)
        .expect("parent cgroup");
    let hook_rel = v2(&hook_cg);
    assert!(
        hook_rel.ends_with("/operator") && parent.join("operator").ends_with(&hook_rel[1..]),
        "the hook is in the operator cgroup under {}: {hook_cg}",
        parent.display()
    );
    let who = poll_file(&format!("{scratch}/hook-who.txt"));
    assert!(who.contains("identity: operator"), "{who}");
}

/// ancestry mode: runs and hooks wait, before they execute anything, until the daemon has
/// bound them (a smith, the operator).
#[test]
fn runs_and_hooks_are_bound_in_ancestry_mode() {
    let s = Sm::new(json!({
        "identity": "ancestry",
        "hooks": {"run.started": [["sh", "-c",
            "cat {mount}/.smithfs/whoami > {mount}/../hook-who.txt"]]}
    }));
    s.task("env\n");
    assert_eq!(
        s.wait_file(20, "results/final.md"),
        "result of smith-root\n"
    );
    let who = s.read("smiths/smith-root/private/whoami.txt").unwrap();
    assert!(who.contains("identity: smith"), "{who}");
    assert!(who.contains("full id: smith-root"), "{who}");
    assert!(who.contains("ancestry"), "{who}");
    assert!(s.metas(ROOT)[0]["cgroup"].is_null());
    let scratch = s.m.scratch().display().to_string();
    let hook = poll_file(&format!("{scratch}/hook-who.txt"));
    assert!(hook.contains("identity: operator"), "{hook}");
}

/// docs/SPEC.md §12: a run's environment has HOME, the XDG directories and the CLIs' variables
/// inside its `home/`, `TMPDIR=/tmp`, then `agent.env` (which wins), then the secrets of
/// `agent.secrets_file`; a secret's value is masked in `messages.log` and stored nowhere in the
/// tree.
#[test]
fn runs_get_home_and_the_secrets_which_the_tree_never_holds() {
    const VALUE: &str = "s3cret-value-42-xyz";
    let outside = tempfile::tempdir().expect("tempdir");
    let file = outside.path().join("secrets.env");
    std::fs::write(&file, format!("# test\nSMITH_TEST_TOKEN={VALUE}\n")).expect("write");
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .expect("chmod");
    // In the view (the run side of the sandbox), as the agents' uid.
    let mut s = Sm::with(
        common::MountOpts {
            allow_other: true,
            ..common::MountOpts::default()
        },
        json!({"agent": {
            "env": {"XDG_CACHE_HOME": "/override"},
            "secrets_file": file,
        }}),
    );
    s.task("sandboxenv\n");
    s.wait_file(20, "results/final.md");
    let dir = s.dir();
    let home = format!("{dir}/smiths/smith-root/home");
    let env = s
        .read("smiths/smith-root/private/env.txt")
        .expect("env.txt");
    for want in [
        format!("HOME={home}"),
        format!("XDG_CONFIG_HOME={home}/.config"),
        format!("XDG_DATA_HOME={home}/.local/share"),
        "XDG_CACHE_HOME=/override".to_string(),
        format!("CLAUDE_CONFIG_DIR={home}/.claude"),
        format!("CODEX_HOME={home}/.codex"),
        format!("GEMINI_CLI_HOME={home}"),
        "TMPDIR=/tmp".to_string(),
    ] {
        assert!(env.lines().any(|l| l == want), "{want} in\n{env}");
    }
    assert!(env.lines().any(|l| l.starts_with("USER=")), "{env}");
    let want_sha = sh_in(
        s.m.path(),
        &format!("printf %s {VALUE} | sha256sum | cut -c1-64"),
    )
    .expect_ok("sha256sum");
    assert_eq!(
        s.read("smiths/smith-root/private/token.sha").expect("sha"),
        want_sha,
        "the secret reached the run"
    );
    let log = s
        .read("smiths/smith-root/conversations/run-0001/messages.log")
        .expect("log");
    assert!(log.contains("token: ***."), "{log}");
    assert!(
        log.contains("split: ***"),
        "masked across two writes: {log}"
    );
    assert!(!log.contains(&VALUE[..8]), "{log}");
    // Nowhere in the store: not config.json (it names the file), not the journal, not a log.
    s.m.umount();
    let r = run(std::process::Command::new("grep")
        .args(["-rlF", VALUE])
        .arg(s.m.path()));
    assert_eq!(r.stdout, "", "files holding the secret: {r:?}");
    let cfg = std::fs::read_to_string(s.m.path().join("config.json")).expect("config");
    assert!(cfg.contains("secrets.env") && !cfg.contains(VALUE), "{cfg}");
    s.m.mount();
}

/// docs/SPEC.md §12: `agent.secrets_file` readable by others, or inside the tree, is refused
/// at mount naming the key.
#[test]
fn a_secrets_file_smiths_could_read_is_refused_at_mount() {
    let m = TestMount::new();
    let wide = m.scratch().join("wide.env");
    std::fs::write(&wide, "K=value-long\n").expect("write");
    std::fs::set_permissions(&wide, std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .expect("chmod");
    let inside = m.path().join("agents/s.env");
    std::fs::write(&inside, "K=value-long\n").expect("write");
    std::fs::set_permissions(&inside, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .expect("chmod");
    let mut m = m;
    m.umount();
    for (path, needle) in [(&wide, "mode 0644"), (&inside, "inside the tree")] {
        let cfg = m.path().join("config.json");
        let mut v: Value =
            serde_json::from_str(&std::fs::read_to_string(&cfg).expect("cfg")).expect("json");
        v["agent"]["secrets_file"] = json!(path);
        std::fs::write(&cfg, v.to_string()).expect("write");
        let r = smithfs([OsStr::new("mount"), m.path().as_os_str()]);
        assert!(!r.ok(), "mounted with {path:?}");
        assert!(
            r.stderr.contains("agent.secrets_file") && r.stderr.contains(needle),
            "{r:?}"
        );
    }
    let cfg = m.path().join("config.json");
    let mut v: Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg).expect("cfg")).expect("json");
    v["agent"]
        .as_object_mut()
        .expect("agent")
        .remove("secrets_file");
    std::fs::write(&cfg, v.to_string()).expect("write");
    m.mount();
}
