//! The CLI of the scheduler (`status events wait cancel doctor`, docs/SPEC.md §6) against a
//! plain directory holding the `.smithfs/` files a mount serves, filled from a real scheduler.
//! Skipped while the subcommands are not wired into the binary.

use crate::common;

use std::process::{Command, Output};

use common::sched::*;

fn smithfs(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_smithfs"));
    c.args(args).current_dir("/");
    for (k, v) in env {
        c.env(k, v);
    }
    c.env_remove("SMITH_MOUNT").env_remove("SMITH_FULL_ID");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run smithfs")
}

fn wired() -> bool {
    let ok = smithfs(&["status", "--help"], &[]).status.success();
    if !ok {
        eprintln!("skipped: `smithfs status` is not wired into the binary yet");
    }
    ok
}

fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A finished tree (root done, one child failed) with the control files a mount would serve.
fn finished_tree() -> Env {
    let env = init(Some("split"));
    env.make_child("smith-root/smith-001");
    env.make_child("smith-root/smith-002");
    env.write("smiths/smith-root/children/smith-001/private/fail", "");
    let agent = r#"
if [ "$SMITH_LEVEL" = 0 ]; then
  if [ "$SMITH_WAKE" = children ]; then echo merged > outbox/result.md; exit 0; fi
  for c in children/*; do echo t > "$c/inbox/task-1.md"; done; exit 0
fi
[ -e private/fail ] && exit 2
echo ok > outbox/result.md
"#;
    let s = env.start(env.config_with_agent(agent, |_| {}));
    poll_until(30, "final.md", || env.read("results/final.md"));
    poll_until(10, "root done", || {
        (state(&s, "smith-root") == "done").then_some(())
    });
    let status = s.status_json();
    let doc: smithfs::sched::view::StatusDoc =
        serde_json::from_slice(&status).expect("status.json matches the CLI's view");
    assert_eq!(doc.smiths.len(), 3);
    s.shutdown();
    std::fs::create_dir_all(env.p(".smithfs")).expect("mkdir .smithfs");
    std::fs::write(env.p(".smithfs/status.json"), status).expect("status");
    let mut journal = std::fs::read(env.p(".smithfs-state/events.jsonl")).expect("journal");
    journal.extend_from_slice(b"{\"ts\":\"torn");
    std::fs::write(env.p(".smithfs/events.jsonl"), journal).expect("events");
    std::fs::write(env.p(".smithfs/ctl"), "").expect("ctl");
    env
}

#[test]
fn status_events_wait_cancel() {
    if !wired() {
        return;
    }
    let env = finished_tree();
    let dir = env.dir.to_string_lossy().into_owned();

    let o = smithfs(&["status", &dir], &[]);
    assert!(o.status.success());
    let text = out(&o);
    assert!(text.starts_with("smith-root"), "{text}");
    assert!(
        text.contains("├─ smith-root/smith-001") && text.contains("failed"),
        "{text}"
    );
    assert!(!text.contains('\x1b'), "plain when not a tty");
    let o = smithfs(&["status", "--json"], &[("SMITH_MOUNT", &dir)]);
    assert!(o.status.success(), "DIR from $SMITH_MOUNT");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["agent_configured"], true);

    let o = smithfs(&["events", &dir], &[]);
    let text = out(&o);
    assert!(
        text.lines()
            .any(|l| l.contains("run.exited") && l.contains("outcome=failed")),
        "{text}"
    );
    assert!(!text.contains("torn"));
    let o = smithfs(&["events", &dir, "--json"], &[]);
    assert!(out(&o)
        .lines()
        .all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()));

    let code = |args: &[&str], env: &[(&str, &str)]| smithfs(args, env).status.code();
    assert_eq!(
        code(&["wait", &dir], &[]),
        Some(0),
        "final.md and root done"
    );
    assert_eq!(
        code(&["wait", &dir, "--smith", "smith-root/smith-001"], &[]),
        Some(1)
    );
    assert_eq!(
        code(&["wait", &dir, "--smith", "smith-root/smith-002"], &[]),
        Some(0)
    );
    assert_eq!(
        code(&["wait", &dir, "--children"], &[]),
        Some(1),
        "one child failed"
    );
    assert_eq!(
        code(
            &["wait", &dir, "--children", "--timeout", "0.2"],
            &[("SMITH_FULL_ID", "smith-root/smith-002")]
        ),
        Some(124),
        "smith-002 has no children: never settles"
    );
    assert_eq!(
        code(&["wait", &dir, "--smith", "smith-root/nope"], &[]),
        Some(2),
        "an unknown smith is a usage error (docs/SPEC.md §6)"
    );
    assert_eq!(code(&["wait", "/nonexistent-smithfs"], &[]), Some(1));

    // `cancel` returns once the journal shows it handled (notes O49, H21): nothing serves this
    // directory, so the test journals the scheduler's answer once the command is written.
    let cancel = Command::new(env!("CARGO_BIN_EXE_smithfs"))
        .args(["cancel", &dir, "smith-root/smith-002"])
        .current_dir("/")
        .env_remove("SMITH_MOUNT")
        .env_remove("SMITH_FULL_ID")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run smithfs cancel");
    poll_until(10, "the cancel written to ctl", || {
        (env.read(".smithfs/ctl").as_deref() == Some("cancel smith-root/smith-002\n")).then_some(())
    });
    let line = "{\"ts\":\"2026-12-05T22:41:12.610392Z\",\"event\":\"run.cancelled\",\"smith\":\"smith-root/smith-002\"}\n";
    let mut journal = std::fs::OpenOptions::new()
        .append(true)
        .open(env.p(".smithfs/events.jsonl"))
        .expect("events.jsonl");
    std::io::Write::write_all(&mut journal, line.as_bytes()).expect("journal the cancel");
    let o = cancel.wait_with_output().expect("wait for cancel");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = smithfs(
        &["cancel", "smith-root"],
        &[("SMITH_MOUNT", "/nonexistent-smithfs")],
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("/nonexistent-smithfs is not a smithfs mount"),
        "{err}"
    );
}

#[test]
fn doctor_reports_each_check() {
    if !wired() {
        return;
    }
    let o = smithfs(&["doctor"], &[]);
    let text = out(&o);
    for what in [
        "/dev/fuse",
        "fusermount3",
        "kernel",
        "cgroups",
        "privileges",
    ] {
        assert!(text.contains(what), "{what} missing in\n{text}");
    }
}
