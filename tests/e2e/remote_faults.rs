//! A remote run when its daemon dies (issue 28, docs/SPEC.md §13 "Restarts", notes R6, R41): a
//! loopback run (`smithfs attach`, its own remote mount, sandboxed) holding its result open when
//! the daemon is SIGKILLed — its mount fails closed, `attach` ends, nothing it half-wrote is
//! published; `mount --resume` re-queues the run and the new run finishes the work. Both identity
//! modes.

use crate::common;

use std::time::Duration;

use common::rel::kill_daemon;
use common::*;

/// The agent: its first run (no `private/tried` yet) opens `outbox/result.md`, writes to it,
/// says so (`private/holding`) and keeps writing until the mount fails under it, then reports
/// the error it got (`private/` is gone with the mount, so to its output); a later run publishes.
const AGENT: &str = r#"
cd "$SMITH_DIR"
if [ ! -e private/tried ]; then
  touch private/tried
  exec 3>outbox/result.md
  echo partial >&3
  touch private/holding
  while echo more >&3; do sleep 0.05; done
  echo "the mount failed under the run"
  exit 3
fi
echo "resumed" > outbox/result.md
"#;

fn killed_daemon_and_resume(mode: &'static str) {
    if !is_root() {
        eprintln!("skipped: attach mounts in a namespace of its own (root)");
        return;
    }
    let config = serde_json::json!({
        "launcher": { "kind": "loopback" },
        "agent": { "command": ["/bin/bash", "-c", AGENT], "retries": 0, "kill_grace_secs": 1 },
    });
    let mut m = TestMount::with_config(&config, mode, Vec::new());
    let root = m.path().join("smiths/smith-root");
    std::fs::write(root.join("inbox/task-1.md"), "go\n").expect("task");
    poll_until(
        Duration::from_secs(60),
        "the run to hold its result open",
        || root.join("private/holding").exists(),
    );
    let meta: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("conversations/run-0001/meta.json")).expect("meta"),
    )
    .expect("meta.json");
    let attach = meta["pid"].as_i64().expect("the run's pid") as i32;
    kill_daemon(m.path());
    // The node's mount fails closed: the agent's writes fail, attach ends with its run.
    poll_until(Duration::from_secs(30), "attach to end", || {
        process_gone(attach)
    });
    let dir = m.path().to_string_lossy().into_owned();
    smithfs(["umount", dir.as_str()]).expect_ok("umount of a dead mount");
    // The store as the kill left it: the open result was never closed, so never published.
    let store = m.path();
    assert!(
        !store.join("results/final.md").exists(),
        "[{mode}] a result the run never closed was published"
    );
    smithfs([
        "mount",
        dir.as_str(),
        "--allow-other",
        "--identity",
        mode,
        "--resume",
    ])
    .expect_ok("mount --resume");
    let (log, second) = ended_run(&m, "smiths/smith-root", 2, 60);
    assert_eq!(second["exit_code"], 0, "[{mode}] {second}\n{log}");
    poll_until(Duration::from_secs(30), "the resumed run's result", || {
        std::fs::read_to_string(m.path().join("results/final.md"))
            .ok()
            .filter(|r| r == "resumed\n")
    });
    let events = std::fs::read_to_string(m.path().join(".smithfs/events.jsonl")).expect("events");
    let of = |name: &str| -> Vec<serde_json::Value> {
        events
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["event"] == name)
            .collect()
    };
    let interrupted = of("run.interrupted");
    assert_eq!(interrupted.len(), 1, "[{mode}] {events}");
    assert_eq!(interrupted[0]["run_id"], "run-0001", "[{mode}]");
    assert_eq!(second["wake"], "task", "[{mode}] re-queued with its wake");
    m.umount();
}

#[test]
fn a_killed_daemon_fails_its_loopback_runs_closed_and_resume_finishes_cgroup() {
    killed_daemon_and_resume("cgroup");
}

#[test]
fn a_killed_daemon_fails_its_loopback_runs_closed_and_resume_finishes_ancestry() {
    killed_daemon_and_resume("ancestry");
}
