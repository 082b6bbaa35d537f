//! User hooks (docs/SPEC.md §5, §8): the event's journal line on stdin, placeholders filled, a
//! timeout, and never a delay for runs; plus triggers handed in by the fs.

use crate::common;

use std::time::{Duration, Instant};

use common::sched::*;
use smithfs::config::HookEvent;
use smithfs::sched::Trigger;

#[test]
fn hook_receives_the_event_json_on_stdin() {
    let env = init(Some("hello"));
    let cfg = env.config_with_agent("echo hi > outbox/result.md\n", |c| {
        c.hooks.insert(
            HookEvent::RunExited,
            vec![vec![
                "sh".into(),
                "-c".into(),
                "cat > {mount}/hook-{smith_id}.json".into(),
            ]],
        );
    });
    let s = env.start(cfg);
    let text = poll_until(20, "hook output", || {
        env.read("hook-smith-root.json")
            .filter(|t| t.ends_with('\n'))
    });
    let v: serde_json::Value = serde_json::from_str(text.trim()).expect("event JSON");
    assert_eq!(v["event"], "run.exited");
    assert_eq!(v["smith"], "smith-root");
    assert_eq!(v["outcome"], "done");
    let h = poll_until(10, "hook.exited", || {
        env.events_of("hook.exited", None).pop()
    });
    assert_eq!(h["exit_code"], 0);
    assert_eq!(h["hook_event"], "run.exited");
    s.shutdown();
}

#[test]
fn hanging_and_failing_hooks_are_journaled_without_delaying_runs() {
    let env = init(Some("split"));
    env.make_child("smith-root/smith-001");
    let agent = r#"
if [ "$SMITH_LEVEL" = 0 ] && [ "$SMITH_WAKE" = task ]; then
  echo t > children/smith-001/inbox/task-1.md; exit 0
fi
echo "done $SMITH_ID" > outbox/result.md
"#;
    let cfg = env.config_with_agent(agent, |c| {
        c.hook_timeout_secs = 2;
        c.hooks.insert(
            HookEvent::RunStarted,
            vec![
                vec!["sleep".into(), "1000".into()],
                vec!["sh".into(), "-c".into(), "exit 7".into()],
            ],
        );
    });
    let t0 = Instant::now();
    let s = env.start(cfg);
    poll_until(20, "final.md", || env.read("results/final.md"));
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "three runs finished while their hooks hang: {:?}",
        t0.elapsed()
    );
    let hooks = poll_until(20, "6 hook.exited", || {
        let h = env.events_of("hook.exited", None);
        (h.len() == 6).then_some(h)
    });
    let timed_out = hooks.iter().filter(|h| h["timed_out"] == true).count();
    assert_eq!(timed_out, 3, "{hooks:?}");
    assert!(hooks.iter().filter(|h| h["exit_code"] == 7).count() == 3);
    assert!(hooks.iter().all(|h| h["hook_event"] == "run.started"));
    s.shutdown();
}

#[test]
fn triggers_from_the_fs_are_journaled_and_schedule() {
    let env = init(None);
    let s = env.start(env.config_with_agent("echo from-trigger > outbox/result.md\n", |_| {}));
    let root = poll_until(10, "registry", || env.registry.root());
    // As the fs would: the operator wrote a task, then a denial happened.
    env.write("smiths/smith-root/inbox/task-2.md", "do it\n");
    s.trigger(Trigger::TaskAssigned {
        smith: root,
        file: "task-2.md".into(),
    });
    s.trigger(Trigger::AccessDenied {
        smith: None,
        pid: 42,
        op: "unlink".into(),
        path: "smiths/smith-root/smith.md".into(),
        errno: libc::EPERM,
        rule: "structure".into(),
    });
    let fin = poll_until(20, "final.md", || env.read("results/final.md"));
    assert_eq!(fin, "from-trigger\n");
    let ta = env.events_of("task.assigned", Some("smith-root"));
    assert_eq!(ta.len(), 1);
    assert_eq!(ta[0]["path"], "smiths/smith-root/inbox/task-2.md");
    let d = poll_until(10, "access.denied", || {
        env.events_of("access.denied", None).pop()
    });
    assert_eq!(d["smith"], serde_json::Value::Null);
    assert_eq!(d["errno"], libc::EPERM);
    // A repeated trigger for a task the run already saw schedules nothing.
    s.trigger(Trigger::TaskAssigned {
        smith: root,
        file: "task-2.md".into(),
    });
    poll_until(10, "second task.assigned", || {
        let t = env.events_of("task.assigned", None);
        (t.len() == 2).then_some(())
    });
    assert_eq!(env.events_of("task.assigned", None)[1]["scheduled"], false);
    s.shutdown();
    assert_eq!(env.events_of("run.started", None).len(), 1);
}

/// The cap on running hooks is per event and smith (notes S26, H24): a storm of
/// `access.denied` of one identity whose hooks hang fills its own cap (`hook.exited` says "not
/// started"), a denial of another smith still runs its hook, and the hook of `run.exited` still
/// runs.
#[test]
fn a_denial_storm_does_not_starve_other_hooks() {
    let env = init(None);
    let cfg = env.config_with_agent("echo ok > outbox/result.md\n", |c| {
        c.hook_timeout_secs = 3;
        c.hooks.insert(
            HookEvent::AccessDenied,
            vec![vec![
                "sh".into(),
                "-c".into(),
                "cat >/dev/null; sleep 5".into(),
            ]],
        );
        c.hooks.insert(
            HookEvent::RunExited,
            vec![vec![
                "sh".into(),
                "-c".into(),
                "cat >/dev/null; echo ran > {mount}/exited-hook".into(),
            ]],
        );
    });
    let s = env.start(cfg);
    // 20 a second pass the rate limit (docs/SPEC.md §7): 40 hooks over two seconds.
    for pid in 0..40 {
        if pid == 20 {
            std::thread::sleep(std::time::Duration::from_millis(1100));
        }
        s.trigger(Trigger::AccessDenied {
            smith: None,
            pid,
            op: "create".into(),
            path: "smiths/smith-root/private/x".into(),
            errno: libc::EACCES,
            rule: "zone".into(),
        });
    }
    poll_until(20, "a storm hook refused at the cap", || {
        env.events_of("hook.exited", None).into_iter().find(|h| {
            h["error"]
                .as_str()
                .is_some_and(|e| e.contains("not started"))
        })
    });
    let root = poll_until(10, "registry", || env.registry.root());
    // Another smith's denial, while the storm's hooks fill their cap: its hook starts (and is
    // killed at the 3 s timeout), never "not started".
    s.trigger(Trigger::AccessDenied {
        smith: Some(root),
        pid: 99,
        op: "create".into(),
        path: "smiths/smith-root/inbox/x".into(),
        errno: libc::EACCES,
        rule: "zone".into(),
    });
    let other = poll_until(20, "the other smith's denial hook", || {
        env.events_of("hook.exited", Some("smith-root"))
            .into_iter()
            .find(|h| h["hook_event"] == "access.denied")
    });
    assert!(
        other["error"].is_null(),
        "another smith's hook was not started: {other}"
    );
    env.write("smiths/smith-root/inbox/task-1.md", "go\n");
    s.trigger(Trigger::TaskAssigned {
        smith: root,
        file: "task-1.md".into(),
    });
    // `echo ran > F` creates F before it writes: wait for the line, not the name.
    let ran = poll_until(20, "the run.exited hook", || {
        env.read("exited-hook").filter(|s| s.ends_with('\n'))
    });
    assert_eq!(ran, "ran\n");
    s.shutdown();
}
