//! Stopping runs: timeouts (process group, and the whole cgroup with a cgroup binder), cancel,
//! unmount (`shutdown`), and a restart that finds runs a dead daemon left behind (§9).

use crate::common;

use std::process::Command;
use std::sync::Arc;

use common::sched::*;

/// The root agent starts a background sleep in its group and a `setsid` one outside it, then
/// hangs.
const HANGING_AGENT: &str = r#"
sleep 1000 &
echo $! > private/bg.pid
setsid sleep 1001 &
echo $! > private/setsid.pid
sleep 1002
"#;

fn pid_in(env: &Env, rel: &str) -> i32 {
    poll_until(10, rel, || {
        env.read(rel).and_then(|t| t.trim().parse().ok())
    })
}

/// Kills its processes when dropped, so a failing test leaks nothing that holds its output.
struct KillOnDrop(Vec<i32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for p in &self.0 {
            kill(*p);
        }
    }
}

fn kill(pid: i32) {
    // SAFETY: plain kill(2) of a test process.
    unsafe { libc::kill(pid, libc::SIGKILL) };
}

#[test]
fn timeout_kills_the_process_group() {
    let env = init(Some("hang"));
    let s = env.start(env.config_with_agent(HANGING_AGENT, |c| c.agent.timeout_secs = 1));
    let bg = pid_in(&env, "smiths/smith-root/private/bg.pid");
    let escaped = pid_in(&env, "smiths/smith-root/private/setsid.pid");
    let _guard = KillOnDrop(vec![bg, escaped]);
    poll_until(15, "run.timed_out", || {
        env.events_of("run.timed_out", Some("smith-root")).pop()
    });
    assert!(!alive(bg), "the group's background process is killed");
    // With NoBinder a run is only as contained as its process group: a descendant that called
    // setsid survives. The cgroup binder closes this hole (next test).
    assert!(alive(escaped), "documented limitation of NoBinder");
    kill(escaped);
    let exits = env.events_of("run.exited", Some("smith-root"));
    assert_eq!(exits.len(), 1);
    assert_eq!(exits[0]["signal"], libc::SIGTERM);
    assert_eq!(exits[0]["outcome"], "failed");
    let names: Vec<String> = env
        .events()
        .iter()
        .filter_map(|e| e["event"].as_str().map(String::from))
        .filter(|n| n.starts_with("run."))
        .collect();
    assert_eq!(names, ["run.started", "run.exited", "run.timed_out"]);
    let m = &env.metas("smiths/smith-root")[0];
    assert_eq!(m["timed_out"], true);
    assert_eq!(state(&s, "smith-root"), "failed");
    s.shutdown();
}

#[test]
fn timeout_with_a_cgroup_binder_kills_setsid_descendants_too() {
    let Some(binder) = TestCgroupBinder::new() else {
        eprintln!("skipped: cannot create a cgroup here");
        return;
    };
    let env = init(Some("hang"));
    let s = env.start_with(
        env.config_with_agent(HANGING_AGENT, |c| c.agent.timeout_secs = 1),
        Arc::new(binder),
        false,
    );
    let bg = pid_in(&env, "smiths/smith-root/private/bg.pid");
    let escaped = pid_in(&env, "smiths/smith-root/private/setsid.pid");
    let _guard = KillOnDrop(vec![bg, escaped]);
    poll_until(15, "run.timed_out", || {
        env.events_of("run.timed_out", Some("smith-root")).pop()
    });
    assert!(!alive(bg));
    assert!(
        !alive(escaped),
        "the cgroup takes the setsid descendant with it"
    );
    let started = &env.events_of("run.started", Some("smith-root"))[0];
    assert!(started["cgroup"].is_string());
    s.shutdown();
}

#[test]
fn cancel_stops_a_subtree_and_settles_it() {
    let env = init(Some("split"));
    env.make_child("smith-root/smith-001");
    env.make_child("smith-root/smith-001/smith-001");
    let agent = r#"
if [ "$SMITH_LEVEL" = 0 ] && [ "$SMITH_WAKE" = children ]; then
  echo "children settled" > outbox/result.md; exit 0
fi
for c in children/*; do
  [ -d "$c/inbox" ] && echo task > "$c/inbox/task-1.md"
done
[ "$SMITH_LEVEL" = 0 ] && exit 0
echo $$ > private/pid
sleep 1000
"#;
    let s = env.start(env.config_with_agent(agent, |_| {}));
    let c1 = "smith-root/smith-001";
    let pid = pid_in(&env, "smiths/smith-root/children/smith-001/private/pid");
    let _guard = KillOnDrop(vec![pid]);
    poll_until(10, "running", || (state(&s, c1) == "running").then_some(()));
    assert!(matches!(
        s.cancel("smith-root/nope"),
        Err(smithfs::sched::CancelError::UnknownSmith(_))
    ));
    s.cancel(c1).expect("cancel");
    poll_until(15, "cancelled", || {
        (state(&s, c1) == "cancelled").then_some(())
    });
    assert!(!alive(pid));
    assert_eq!(state(&s, "smith-root/smith-001/smith-001"), "cancelled");
    let cancelled = env.events_of("run.cancelled", Some(c1));
    assert_eq!(cancelled.len(), 1);
    assert_eq!(cancelled[0]["run_id"], "run-0001");
    let fin = poll_until(15, "final.md", || env.read("results/final.md"));
    assert_eq!(
        fin, "children settled\n",
        "cancelled counts as settled: the root is woken"
    );
    s.shutdown();
}

#[test]
fn shutdown_interrupts_runs_and_resume_requeues_them() {
    let env = init(Some("long"));
    let s = env.start(env.config_with_agent("echo $$ > private/pid\nsleep 1000\n", |_| {}));
    let pid = pid_in(&env, "smiths/smith-root/private/pid");
    let _guard = KillOnDrop(vec![pid]);
    s.shutdown();
    assert!(!alive(pid));
    let ints = env.events_of("run.interrupted", Some("smith-root"));
    assert_eq!(ints.len(), 1);
    assert_eq!(env.metas("smiths/smith-root")[0]["interrupted"], true);

    // Without --resume the interrupted task is not run again (it is older than the last start).
    let cfg = env.config_with_agent("echo done > outbox/result.md\n", |_| {});
    let s = env.start(cfg.clone());
    poll_until(10, "status", || {
        (state(&s, "smith-root") == "idle").then_some(())
    });
    s.shutdown();
    assert_eq!(env.events_of("run.started", None).len(), 1);

    // With --resume it is re-queued with its wake reason.
    let s = env.start_with(cfg, Arc::new(smithfs::sched::NoBinder), true);
    let fin = poll_until(15, "final.md", || env.read("results/final.md"));
    assert_eq!(fin, "done\n");
    let metas = env.metas("smiths/smith-root");
    assert_eq!(metas.len(), 2);
    assert_eq!(metas[1]["run_id"], "run-0002");
    assert_eq!(metas[1]["wake"], "task");
    s.shutdown();
}

/// `sleep 1000` leading its own session (pid = pgid = sid), like a run's leader. The `setsid`
/// program would fork when called by a group leader, so its pid would not be the sleeper's.
fn sleeper_in_own_session() -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new("sleep");
    cmd.arg("1000");
    // SAFETY: setsid is async-signal-safe and has no preconditions.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    cmd.spawn().expect("spawn")
}

/// A run a dead daemon left behind: recorded as started, never exited, still alive.
fn forge_started_run(env: &Env, pid: i32, ticks: u64) {
    let line = serde_json::json!({
        "ts": smithfs::sched::time::now(), "event": "run.started", "smith": "smith-root",
        "run_id": "run-0001", "wake": "task", "pid": pid, "pgid": pid, "start_ticks": ticks,
    });
    std::fs::create_dir_all(env.p(".smithfs-state")).expect("state dir");
    std::fs::write(
        env.p(".smithfs-state/events.jsonl"),
        format!("{line}\n{{\"torn"),
    )
    .expect("journal");
}

#[test]
fn restart_kills_leftovers_and_resume_finishes_the_work() {
    let env = init(Some("work"));
    let mut leftover = sleeper_in_own_session();
    let pid = leftover.id() as i32;
    let _guard = KillOnDrop(vec![pid]);
    let ticks = smithfs::sched::runner::start_ticks(pid as u32).expect("ticks");
    forge_started_run(&env, pid, ticks);
    let s = env.start_with(
        env.config_with_agent("echo resumed > outbox/result.md\n", |_| {}),
        Arc::new(smithfs::sched::NoBinder),
        true,
    );
    let fin = poll_until(15, "final.md", || env.read("results/final.md"));
    assert_eq!(fin, "resumed\n");
    assert!(!alive(pid), "the leftover is killed");
    let _ = leftover.wait();
    let ints = env.events_of("run.interrupted", Some("smith-root"));
    assert_eq!(ints.len(), 1);
    assert_eq!(ints[0]["run_id"], "run-0001");
    assert_eq!(ints[0]["pid"], pid);
    s.shutdown();
}

#[test]
fn restart_never_kills_a_recycled_pid() {
    let env = init(Some("work"));
    let mut other = sleeper_in_own_session();
    let pid = other.id() as i32;
    let _guard = KillOnDrop(vec![pid]);
    let ticks = smithfs::sched::runner::start_ticks(pid as u32).expect("ticks");
    forge_started_run(&env, pid, ticks + 1);
    let s = env.start(env.config_with_agent("echo ok > outbox/result.md\n", |_| {}));
    poll_until(15, "run.interrupted", || {
        env.events_of("run.interrupted", None).pop()
    });
    assert!(
        alive(pid),
        "a different process now has that pid: left alone"
    );
    kill(pid);
    let _ = other.wait();
    s.shutdown();
}
