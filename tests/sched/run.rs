//! The scheduler on a plain directory laid out by `smithfs init` (no FUSE): a task runs, a
//! result reaches `results/final.md`, children settle and wake their parent, failures are
//! retried, bad smith configs fail one run, and `max_concurrent` holds.

use crate::common;

use common::sched::*;

/// Root/child agent used by several tests: level 0 dispatches one task to each child and, woken
/// for children, concatenates their results; a child publishes, or fails when
/// `private/fail` exists; `private/sleep` holds seconds to sleep first.
const TREE_AGENT: &str = r#"
echo "run of $SMITH_FULL_ID wake=$SMITH_WAKE"
if [ "$SMITH_LEVEL" = 0 ]; then
  if [ "$SMITH_WAKE" = children ]; then
    cat children/*/outbox/result.md > private/r.md 2>/dev/null
    mv private/r.md outbox/result.md
  else
    for c in children/*; do
      printf 'work for %s\n' "$c" > private/t.md
      mv private/t.md "$c/inbox/task-1.md"
    done
  fi
  exit 0
fi
[ -e private/sleep ] && sleep "$(cat private/sleep)"
[ -e private/fail ] && exit 3
echo "result of $SMITH_ID" > private/r.md
mv private/r.md outbox/result.md
"#;

#[test]
fn task_runs_and_root_result_becomes_final() {
    let env = init(Some("say hello"));
    let cfg = env.config_with_agent(
        r#"
echo "agent started"
env | grep '^SMITH_' | sort > private/env.txt
ls /proc/self/fd | sort -n | tr '\n' ' ' > private/fds.txt
readlink /proc/self/fd/0 > private/stdin.txt
pwd > private/pwd.txt
printf 'answer from %s\n' "$SMITH_FULL_ID" > private/r.md
mv private/r.md outbox/result.md
"#,
        |_| {},
    );
    let s = env.start(cfg);
    let fin = poll_until(20, "results/final.md", || env.read("results/final.md"));
    assert_eq!(fin, "answer from smith-root\n");
    poll_until(10, "root done", || {
        (state(&s, "smith-root") == "done").then_some(())
    });
    let root = "smiths/smith-root";
    let envtxt = env
        .read(&format!("{root}/private/env.txt"))
        .unwrap_or_default();
    let dir = env.dir.display().to_string();
    for want in [
        "SMITH_ID=smith-root".to_string(),
        "SMITH_FULL_ID=smith-root".to_string(),
        "SMITH_LEVEL=0".to_string(),
        "SMITH_PARENT=".to_string(),
        "SMITH_WAKE=task".to_string(),
        format!("SMITH_MOUNT={dir}"),
        format!("SMITH_DIR={dir}/{root}"),
        format!("SMITH_TASK_FILE={dir}/{root}/inbox/task-root.md"),
    ] {
        assert!(
            envtxt.lines().any(|l| l == want),
            "{want} missing in\n{envtxt}"
        );
    }
    assert_eq!(
        env.read(&format!("{root}/private/fds.txt")).as_deref(),
        Some("0 1 2 3 "),
        "only fds 0–2 (3 is ls's own)"
    );
    assert_eq!(
        env.read(&format!("{root}/private/stdin.txt")).as_deref(),
        Some("/dev/null\n")
    );
    assert_eq!(
        env.read(&format!("{root}/private/pwd.txt")),
        Some(format!("{dir}/{root}\n"))
    );
    let metas = env.metas(root);
    assert_eq!(metas.len(), 1);
    let m = &metas[0];
    assert_eq!(m["run_id"], "run-0001");
    assert_eq!(m["wake"], "task");
    assert_eq!(m["exit_code"], 0);
    assert_eq!(m["pid"], m["pgid"]);
    assert!(m["end"].is_string());
    assert_eq!(
        m["command"][1],
        format!("{dir}/agents/agent.sh"),
        "placeholder filled"
    );
    let log = env
        .read(&format!("{root}/conversations/run-0001/messages.log"))
        .unwrap_or_default();
    assert!(log.contains("agent started"), "{log}");
    let st = s.status();
    let r = smith_status(&st, "smith-root");
    assert_eq!(r["runs"], 1);
    assert_eq!(r["has_result"], true);
    assert_eq!(r["parent"], serde_json::Value::Null);
    assert_eq!(r["last_run"]["exit_code"], 0);
    assert_eq!(st["agent_configured"], true);
    let exited = env.events_of("run.exited", Some("smith-root"));
    assert_eq!(exited.len(), 1);
    assert_eq!(exited[0]["outcome"], "done");
    assert_eq!(exited[0]["exit_code"], 0);
    s.shutdown();
}

#[test]
fn no_agent_configured_means_tasks_wait() {
    let env = init(Some("wait for me"));
    let s = env.start(smithfs::config::Config::default());
    poll_until(10, "status published", || {
        (state(&s, "smith-root") == "queued").then_some(())
    });
    assert_eq!(s.status()["agent_configured"], false);
    s.shutdown();
    assert!(env.metas("smiths/smith-root").is_empty());
}

#[test]
fn children_settle_and_wake_the_parent() {
    let env = init(Some("split"));
    env.make_child("smith-root/smith-001");
    env.make_child("smith-root/smith-002");
    let s = env.start(env.config_with_agent(TREE_AGENT, |_| {}));
    let fin = poll_until(30, "final.md", || env.read("results/final.md"));
    assert_eq!(fin, "result of smith-001\nresult of smith-002\n");
    poll_until(10, "root done", || {
        (state(&s, "smith-root") == "done").then_some(())
    });
    let metas = env.metas("smiths/smith-root");
    let wakes: Vec<_> = metas
        .iter()
        .map(|m| m["wake"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(wakes, ["task", "children"]);
    let settled = env.events_of("children.settled", Some("smith-root"));
    assert_eq!(settled.len(), 1);
    // The first root run ended with its children queued or running: waiting, not failed.
    let exits = env.events_of("run.exited", Some("smith-root"));
    assert_eq!(exits[0]["outcome"], "waiting");
    assert_eq!(exits[1]["outcome"], "done");
    for c in ["smith-root/smith-001", "smith-root/smith-002"] {
        assert_eq!(state(&s, c), "done");
        let env_env = env.events_of("run.started", Some(c));
        assert_eq!(env_env.len(), 1, "{c} ran once");
    }
    s.shutdown();
}

#[test]
fn failing_run_is_retried_then_failed_and_parent_still_woken() {
    let env = init(Some("split"));
    env.make_child("smith-root/smith-001");
    env.make_child("smith-root/smith-002");
    env.write("smiths/smith-root/children/smith-001/private/fail", "");
    let s = env.start(env.config_with_agent(TREE_AGENT, |c| c.agent.retries = 1));
    let fin = poll_until(30, "final.md", || env.read("results/final.md"));
    assert_eq!(fin, "result of smith-002\n");
    let c1 = "smith-root/smith-001";
    assert_eq!(state(&s, c1), "failed");
    let exits = env.events_of("run.exited", Some(c1));
    let outcomes: Vec<_> = exits
        .iter()
        .map(|e| e["outcome"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(outcomes, ["retry", "failed"]);
    assert_eq!(exits[0]["exit_code"], 3);
    let wakes: Vec<_> = env
        .metas("smiths/smith-root/children/smith-001")
        .iter()
        .map(|m| m["wake"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(wakes, ["task", "retry"]);
    assert_eq!(smith_status(&s.status(), c1)["runs"], 2);
    s.shutdown();
}

#[test]
fn malformed_smith_config_fails_that_run_only() {
    let env = init(Some("split"));
    env.make_child("smith-root/smith-001");
    env.make_child("smith-root/smith-002");
    env.write(
        "smiths/smith-root/children/smith-001/config.json",
        r#"{"agent": {"comand": ["x"]}}"#,
    );
    let s = env.start(env.config_with_agent(TREE_AGENT, |_| {}));
    let fin = poll_until(30, "final.md", || env.read("results/final.md"));
    assert_eq!(fin, "result of smith-002\n");
    let c1 = "smith-root/smith-001";
    assert_eq!(state(&s, c1), "failed");
    let exits = env.events_of("run.exited", Some(c1));
    assert_eq!(exits.len(), 1);
    let err = exits[0]["error"].as_str().unwrap_or("");
    assert!(
        err.contains("smiths/smith-root/children/smith-001/config.json")
            && err.contains("agent.comand"),
        "{err}"
    );
    assert_eq!(exits[0]["outcome"], "failed");
    let log = env
        .read("smiths/smith-root/children/smith-001/conversations/run-0001/messages.log")
        .unwrap_or_default();
    assert!(
        log.contains("agent.comand"),
        "the reason is in the run log too: {log}"
    );
    s.shutdown();
}

#[test]
fn smith_config_overrides_are_merged() {
    let env = init(Some("split"));
    env.make_child("smith-root/smith-001");
    env.write(
        "smiths/smith-root/children/smith-001/config.json",
        r#"{"agent": {"command": ["sh", "-c", "echo \"$GREETING {smith_id} {level}\" > outbox/result.md"], "env": {"GREETING": "hi"}}}"#,
    );
    let s = env.start(env.config_with_agent(TREE_AGENT, |_| {}));
    let fin = poll_until(30, "final.md", || env.read("results/final.md"));
    assert_eq!(fin, "hi smith-001 1\n");
    s.shutdown();
}

#[test]
fn max_concurrent_is_never_exceeded() {
    let env = init(Some("split"));
    for i in 1..=5 {
        let c = format!("smith-root/smith-{i:03}");
        env.make_child(&c);
        env.write(
            &format!("smiths/smith-root/children/smith-{i:03}/private/sleep"),
            "0.3",
        );
    }
    let s = env.start(env.config_with_agent(TREE_AGENT, |c| c.scheduler.max_concurrent = 2));
    poll_until(30, "final.md", || env.read("results/final.md"));
    let mut spans = Vec::new();
    for rel in std::iter::once("smiths/smith-root".to_string())
        .chain((1..=5).map(|i| format!("smiths/smith-root/children/smith-{i:03}")))
    {
        for m in env.metas(&rel) {
            spans.push((ts(&m["start"]), ts(&m["end"])));
        }
    }
    assert_eq!(spans.len(), 7, "root twice, five children once");
    let mut points: Vec<(f64, i32)> = spans
        .iter()
        .flat_map(|(a, b)| [(*a, 1), (*b, -1)])
        .collect();
    points.sort_by(|x, y| {
        x.partial_cmp(y)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(x.1.cmp(&y.1))
    });
    let (mut cur, mut max) = (0, 0);
    for (_, d) in points {
        cur += d;
        max = max.max(cur);
    }
    assert_eq!(max, 2, "at most 2 at once, and the limit is used");
    s.shutdown();
}
