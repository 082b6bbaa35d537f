//! Operator experience, the daemon's side (issue 11, docs/SPEC.md §5–§7) on real mounts:
//! `smithfs reload` and SIGHUP (a changed config.json applied without a remount, or refused
//! whole naming the key), scheduling after a failed busy unmount, `tail -f` on
//! `.smithfs/events.jsonl`, `events --follow` across a journal rotation.

use crate::common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::msched::*;
use common::{poll_until, smithfs};
use serde_json::{json, Value};

/// A second agent for reloads: marks its runs, publishes at once.
const AGENT_B: &str = r#"
echo "agent-b $SMITH_FULL_ID $RELOADED_VAR"
printf 'b %s\n' "$RELOADED_VAR" > private/r.md && mv private/r.md outbox/result.md
"#;

/// config.json of the mount with `patch` merged in.
fn patch_config(s: &Sm, patch: Value) {
    let mut cfg: Value =
        serde_json::from_str(&s.read("config.json").expect("config")).expect("config JSON");
    merge(&mut cfg, &patch);
    s.write("config.json", &serde_json::to_string_pretty(&cfg).unwrap());
}

fn reload(s: &Sm) -> common::Run {
    smithfs(["reload", &s.dir()])
}

#[test]
fn reload_applies_a_new_agent_and_refuses_bad_or_remount_only_changes() {
    let s = Sm::new(json!({}));
    s.task("ok\n");
    s.wait_state(30, "smith-root", "done");
    // A new agent and its environment: the next task runs it, without a remount.
    s.write("agents/b.sh", AGENT_B);
    patch_config(
        &s,
        json!({"agent": {"command": ["sh", "{mount}/agents/b.sh"], "env": {"RELOADED_VAR": "v2"}},
               "scheduler": {"max_concurrent": 2}}),
    );
    let r = reload(&s);
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(
        r.stdout.contains("agent, scheduler changed"),
        "{}",
        r.stdout
    );
    let ev = s.wait_events(10, "config.reloaded", None, 1);
    assert_eq!(ev[0]["changed"], json!(["agent", "scheduler"]), "{ev:?}");
    s.write("smiths/smith-root/inbox/task-2.md", "ok\n");
    poll_until(Duration::from_secs(30), "agent-b's result", || {
        s.read("smiths/smith-root/outbox/result.md")
            .is_some_and(|r| r == "b v2\n")
    });

    // Bad JSON: one line naming the problem, exit 1, and the old config stays live.
    let good = s.read("config.json").expect("config");
    s.write("config.json", "{\"agent\": ");
    let r = reload(&s);
    assert_eq!(r.code, Some(1), "{r:?}");
    let err = r.stderr.trim();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("config.json: invalid JSON"), "{err}");
    assert!(err.contains("keeps its current configuration"), "{err}");
    // A wrong type names the key, as mount does.
    s.write(
        "config.json",
        &good.replace("\"max_concurrent\": 2", "\"max_concurrent\": \"2\""),
    );
    let r = reload(&s);
    assert_eq!(r.code, Some(1), "{r:?}");
    assert!(
        r.stderr
            .contains("config.json: scheduler.max_concurrent: invalid type"),
        "{r:?}"
    );
    // A key that needs a remount: refused by name.
    let mut cfg: Value = serde_json::from_str(&good).unwrap();
    cfg["identity"] = json!("ancestry");
    cfg["agent"]["env"]["RELOADED_VAR"] = json!("v3");
    s.write("config.json", &serde_json::to_string(&cfg).unwrap());
    let r = reload(&s);
    assert_eq!(r.code, Some(1), "{r:?}");
    assert!(
        r.stderr.contains("config.json: identity: changed from")
            && r.stderr.contains("needs a remount"),
        "{r:?}"
    );
    assert_eq!(s.of("config.reload_failed", None).len(), 3, "journaled");
    // Still the old agent with the old env.
    s.write("smiths/smith-root/inbox/task-3.md", "ok\n");
    s.wait_events(30, "run.exited", Some("smith-root"), 3);
    assert_eq!(
        s.read("smiths/smith-root/outbox/result.md").as_deref(),
        Some("b v2\n")
    );
    // Usage errors exit 2.
    let r = smithfs(["reload", &s.dir(), "extra"]);
    assert_eq!(r.code, Some(2), "{r:?}");
}

#[test]
fn reload_of_an_agent_lets_waiting_tasks_run_and_status_stops_asking_for_one() {
    let s = Sm::new(json!({}));
    let mut cfg: Value = serde_json::from_str(&s.read("config.json").unwrap()).unwrap();
    cfg["agent"]
        .as_object_mut()
        .expect("agent")
        .remove("command");
    s.write("config.json", &serde_json::to_string(&cfg).unwrap());
    let r = reload(&s);
    assert_eq!(r.code, Some(0), "{r:?}");
    s.task("ok\n");
    let st = s.cli("status", &[]).expect_ok("status");
    assert!(st.contains("set agent.command"), "{st}");
    s.write("agents/b.sh", AGENT_B);
    patch_config(
        &s,
        json!({"agent": {"command": ["sh", "{mount}/agents/b.sh"]}}),
    );
    assert_eq!(reload(&s).code, Some(0));
    s.wait_state(30, "smith-root", "done");
    let st = s.cli("status", &[]).expect_ok("status");
    assert!(!st.contains("set agent.command"), "{st}");
}

#[test]
fn sighup_reloads_config_json_and_journals_the_outcome() {
    let s = Sm::new(json!({}));
    let pid = s.m.daemon_pid().expect("daemon pid");
    patch_config(&s, json!({"hook_timeout_secs": 7}));
    // SAFETY: signalling the daemon this test mounted.
    unsafe { libc::kill(pid, libc::SIGHUP) };
    let ev = s.wait_events(10, "config.reloaded", None, 1);
    assert_eq!(ev[0]["changed"], json!(["hooks"]), "{ev:?}");
    s.write("config.json", "{\"scheduler\": {\"max_concurrent\": 0}}");
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGHUP) };
    let ev = s.wait_events(10, "config.reload_failed", None, 1);
    assert!(
        ev[0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("scheduler.max_concurrent")),
        "{ev:?}"
    );
    assert!(common::is_smithfs_mounted(s.m.path()), "still mounted");
}

#[test]
fn a_failed_busy_unmount_leaves_the_scheduler_and_journal_running() {
    let s = Sm::new(json!({}));
    s.task("ok\n");
    s.wait_state(30, "smith-root", "done");
    let holder = common::Holder::new(s.m.path());
    let r = smithfs(["umount", &s.dir()]);
    assert_ne!(r.code, Some(0), "{r:?}");
    assert!(
        r.stderr.contains(&format!("pid {} (sleep)", holder.pid())),
        "{r:?}"
    );
    // The daemon gave up the unmount (it retries for 3 s) and schedules again.
    let began = Instant::now();
    s.write("smiths/smith-root/inbox/task-2.md", "ok\n");
    s.wait_events(30, "run.exited", Some("smith-root"), 2);
    s.wait_state(30, "smith-root", "done");
    assert!(began.elapsed() < Duration::from_secs(30));
    drop(holder);
}

/// Lines a child prints on `pipe` (stdout or stderr), with the time each arrived.
fn lines_of(
    pipe: impl std::io::Read + Send + 'static,
) -> std::sync::mpsc::Receiver<(Instant, String)> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            if tx.send((Instant::now(), line)).is_err() {
                break;
            }
        }
    });
    rx
}

/// Collect lines from `rx` until one contains `needle` (bounded by `secs`).
fn until_line(
    rx: &std::sync::mpsc::Receiver<(Instant, String)>,
    seen: &mut Vec<String>,
    needle: &str,
    secs: u64,
) -> Instant {
    let end = Instant::now() + Duration::from_secs(secs);
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((t, l)) => {
                let hit = l.contains(needle);
                seen.push(l);
                if hit {
                    return t;
                }
            }
            Err(_) => panic!("no line with {needle:?} within {secs} s; saw {seen:#?}"),
        }
    }
}

/// A child process killed on drop.
struct Kid(std::process::Child);

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `tail -f PATH` (polling every `interval` seconds; GNU tail's default is 1).
fn tail_f(
    path: &std::path::Path,
    interval: &str,
) -> (Kid, std::sync::mpsc::Receiver<(Instant, String)>) {
    let mut c = Command::new("tail")
        .args(["-f", "-s", interval])
        .arg(path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tail");
    let out = lines_of(c.stdout.take().expect("stdout"));
    let err = c.stderr.take().expect("stderr");
    // tail's complaints ("file truncated") become lines too, marked.
    let (tx, rx) = std::sync::mpsc::channel();
    let errs = lines_of(err);
    let tx2 = tx.clone();
    std::thread::spawn(move || {
        for (t, l) in errs {
            let _ = tx2.send((t, format!("STDERR {l}")));
        }
    });
    std::thread::spawn(move || {
        for x in out {
            if tx.send(x).is_err() {
                break;
            }
        }
    });
    (Kid(c), rx)
}

#[test]
fn tail_f_follows_the_virtual_events_file() {
    let s = Sm::new(json!({}));
    s.task("ok\n");
    s.wait_state(30, "smith-root", "done");
    let events = s.p(".smithfs/events.jsonl");
    let size = std::fs::metadata(&events).expect("stat").len();
    let cat = std::fs::read(&events).expect("read");
    assert_eq!(size, cat.len() as u64, "nothing rotated: size = content");
    let (_tail, rx) = tail_f(&events, "1");
    let mut seen = Vec::new();
    until_line(&rx, &mut seen, "result.published", 10);
    let wrote = Instant::now();
    s.write("smiths/smith-root/inbox/task-2.md", "ok\n");
    let t = until_line(&rx, &mut seen, "task-2.md", 10);
    let lag = t.duration_since(wrote);
    eprintln!("tail -f showed the new line after {lag:?}");
    assert!(lag < Duration::from_millis(1500), "{lag:?}");
    until_line(&rx, &mut seen, "\"run.exited\"", 20);
    assert!(
        !seen.iter().any(|l| l.starts_with("STDERR")),
        "tail complained: {seen:#?}"
    );
}

#[test]
fn followers_see_every_line_once_across_journal_rotations() {
    // 4 KiB files, one kept: many rotations, and older files dropped while followed.
    let s = Sm::new(json!({"journal": {"max_bytes": 4096, "keep": 1}}));
    let dir = s.dir();
    let mut follow = Command::new(common::SMITHFS)
        .args(["events", &dir, "--follow", "--json"])
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn follower");
    let frx = lines_of(follow.stdout.take().expect("stdout"));
    let _follow = Kid(follow);
    let events = s.p(".smithfs/events.jsonl");
    let (_tail, trx) = tail_f(&events, "0.2");
    let n = 20;
    let (mut fseen, mut tseen) = (Vec::new(), Vec::new());
    for i in 1..=n {
        let name = format!("task-{i:03}.md");
        s.write(&format!("smiths/smith-root/inbox/{name}"), "ok\n");
        // Paced by the followers (they cannot see what rotation dropped before they looked).
        until_line(&frx, &mut fseen, &name, 15);
        until_line(&trx, &mut tseen, &name, 15);
        poll_until(Duration::from_secs(30), &format!("run {i}"), || {
            let st = s.status_file();
            smith_of(&st, "smith-root")["runs"].as_u64() >= Some(i as u64)
                && smith_of(&st, "smith-root")["state"] == "done"
        });
    }
    let want: Vec<String> = (1..=n)
        .map(|i| format!("smiths/smith-root/inbox/task-{i:03}.md"))
        .collect();
    for (name, seen) in [("events --follow", &fseen), ("tail -f", &tseen)] {
        assert!(
            !seen.iter().any(|l| l.starts_with("STDERR")),
            "{name} complained: {seen:#?}"
        );
        let assigned: Vec<String> = seen
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["event"] == "task.assigned")
            .filter_map(|v| v["path"].as_str().map(str::to_string))
            .collect();
        assert_eq!(assigned, want, "{name}: every task once, in order");
        for l in seen {
            assert!(
                serde_json::from_str::<Value>(l).is_ok(),
                "{name}: not a journal line: {l:?}"
            );
        }
    }
    // The store was rotated and its oldest files dropped (each close to 4 KiB); the size
    // counts every byte ever.
    let size = std::fs::metadata(&events).expect("stat").len();
    let cat = std::fs::read(&events).expect("read");
    assert!(
        size > cat.len() as u64 + 3000,
        "files dropped: {size} vs {}",
        cat.len()
    );
    assert!(
        String::from_utf8_lossy(&cat)
            .lines()
            .all(|l| serde_json::from_str::<Value>(l).is_ok()),
        "cat reads whole lines"
    );
}

#[test]
fn a_waiting_parent_with_an_idle_child_is_woken_once_its_other_children_failed() {
    let s = Sm::new(json!({"agent": {"retries": 0}}));
    // The root makes three children but gives only two a task; they fail (after the root's
    // run is over); the third never gets one.
    s.write(
        "agents/agent.sh",
        r#"
if [ "$SMITH_WAKE" = children ]; then
  ls children > private/r.md; mv private/r.md outbox/result.md; exit 0
fi
if [ "$SMITH_ID" = smith-root ]; then
  mkdir children/smith-001 children/smith-002 children/smith-003
  for c in smith-001 smith-002; do
    echo fail > private/t.md; mv private/t.md children/$c/inbox/task-1.md
  done
  exit 0
fi
sleep 0.5
exit 3
"#,
    );
    s.task("go\n");
    s.wait_state(30, "smith-root/smith-001", "failed");
    s.wait_state(30, "smith-root/smith-002", "failed");
    s.wait_state(30, "smith-root", "done");
    assert_eq!(s.state("smith-root/smith-003"), "idle");
    let started = s.of("run.started", Some("smith-root"));
    assert_eq!(
        started.last().map(|e| e["wake"].clone()),
        Some(json!("children")),
        "{started:?}"
    );
    assert_eq!(started.len(), 2, "woken once: {started:?}");
    assert_eq!(
        s.read("smiths/smith-root/outbox/result.md").as_deref(),
        Some("smith-001\nsmith-002\nsmith-003\n")
    );
}
