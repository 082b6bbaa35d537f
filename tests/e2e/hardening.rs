//! Hardening (issue 10, docs/SPEC.md §5, §7, §9) with real processes on real mounts: hostile task
//! names never reach a shell and are journaled as `task.ignored`; hooks read every value a smith
//! can influence from their environment; the `smithfs run` keeper survives every catchable
//! signal; the journal stays bounded under a denial storm and a restart after rotation still
//! knows who failed; a 100 GiB sparse result costs the daemon and the store nothing.

use crate::common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::launcher::Launcher;
use common::*;

/// A mount with `config` written into config.json before mounting, in identity `mode`.
fn mount_with(config: &str, mode: &'static str) -> TestMount {
    mount_for(Launcher::Local, config, mode)
}

/// [`mount_with`] with `launcher`'s environment for the daemon (a Slurm cluster's `SLURM_CONF`).
fn mount_for(launcher: Launcher, config: &str, mode: &'static str) -> TestMount {
    let mut m = TestMount::with(MountOpts {
        allow_other: true,
        extra: vec!["--identity", mode],
        env: launcher.env(),
        ..MountOpts::default()
    });
    m.umount();
    std::fs::write(m.path().join("config.json"), config).expect("config.json");
    m.mount();
    m
}

/// Every journal line, across rotated files, as JSON values.
fn events(m: &TestMount) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(m.path().join(".smithfs/events.jsonl")).expect("events");
    text.lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn of<'a>(evs: &'a [serde_json::Value], name: &str) -> Vec<&'a serde_json::Value> {
    evs.iter().filter(|e| e["event"] == name).collect()
}

/// The hook: every placeholder as its own argument (never inside the `sh -c` text) and every
/// env var, quoted, one line per event.
fn hook_config(log: &Path) -> String {
    let script = format!(
        "printf '%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s\\n' \"$SMITH_EVENT\" \"$SMITH_FULL_ID\" \
         \"$SMITH_RUN_ID\" \"$SMITH_TASK_FILE\" \"$SMITH_EXIT_CODE\" \"$SMITH_PATH\" \"$1\" \"$2\" \
         \"$3\" \"$4\" \"$5\" \"$6\" >> '{}'",
        log.display()
    );
    let hook = serde_json::json!([
        "sh",
        "-c",
        script,
        "hook",
        "{mount}",
        "{smith_dir}",
        "{task_file}",
        "{smith_id}",
        "{full_id}",
        "{level}"
    ]);
    serde_json::json!({
        "hooks": {
            "task.assigned": [hook.clone()],
            "task.ignored": [hook.clone()],
            "access.denied": [hook],
        }
    })
    .to_string()
}

/// Through `launcher`: the names are written by a process of smith-root on this host, or by the
/// agent of its loopback run (whose own tasks' hooks and `task.assigned` lines are left aside).
fn hostile_names(mode: &'static str, launcher: Launcher) {
    let scratch = tempfile::tempdir().expect("tempdir");
    let log = scratch.path().join("hooks.log");
    let config: serde_json::Value =
        serde_json::from_str(&hook_config(&log)).expect("the hooks' config");
    let m = mount_with(&launcher.config(&config).to_string(), mode);
    let mode = format!("{mode}, {}", launcher.kind());
    m.sh_ok("mkdir smiths/smith-root/children/smith-001");
    // A name cannot hold `/`: the marker is relative (hooks run in `/`, runs in smith dirs).
    let p = format!("pwned-{}-{mode}", std::process::id());
    let pwned = [PathBuf::from("/").join(&p), m.path().join(&p)];
    let names: Vec<Vec<u8>> = vec![
        format!("task-$(touch {p}).md").into_bytes(),
        format!("task-`touch {p}`.md").into_bytes(),
        format!("task-a;touch {p};.md").into_bytes(),
        format!("task-'; touch {p}; '.md").into_bytes(),
        format!("task-\"; touch {p}; \".md").into_bytes(),
        b"task-with space.md".to_vec(),
        format!("task-a\ntouch {p}\n.md").into_bytes(),
        b"task-\xff\xfe.md".to_vec(),
        b"task-.md".to_vec(),
    ];
    // The parent writes each into its child's inbox (and one by rename), bound as smith-root.
    let hex: Vec<String> = names
        .iter()
        .map(|n| n.iter().map(|b| format!("{b:02x}")).collect())
        .collect();
    let code = "import os, sys\n\
        d = b'smiths/smith-root/children/smith-001/inbox/'\n\
        for i, h in enumerate(sys.argv[1:]):\n\
        \x20   n = bytes.fromhex(h)\n\
        \x20   if i == 0:\n\
        \x20       open(b'smiths/smith-root/private/t', 'w').write('x')\n\
        \x20       os.rename(b'smiths/smith-root/private/t', d + n)\n\
        \x20   else:\n\
        \x20       open(d + n, 'w').write('do it')\n";
    let mut argv = vec!["python3", "-c", code];
    argv.extend(hex.iter().map(String::as_str));
    launcher
        .run_as(&m, m.path(), "smith-root", &argv)
        .expect_ok("write hostile task names");
    // A good name, after them.
    launcher
        .run_as(
            &m,
            m.path(),
            "smith-root",
            &[
                "sh",
                "-c",
                "echo go > smiths/smith-root/children/smith-001/inbox/task-good_1.md",
            ],
        )
        .expect_ok("write a good task");
    poll_until(Duration::from_secs(20), "hooks of every name", || {
        std::fs::read_to_string(&log).is_ok_and(|t| {
            t.contains("task.assigned|smith-root/smith-001|")
                && t.matches("task.ignored|").count() == names.len()
        })
    });
    let evs = events(&m);
    let ignored = of(&evs, "task.ignored");
    assert_eq!(ignored.len(), names.len(), "[{mode}] {ignored:#?}");
    for e in &ignored {
        assert_eq!(e["smith"], "smith-root/smith-001");
        let path = e["path"].as_str().expect("path");
        assert!(
            path.starts_with("smiths/smith-root/children/smith-001/inbox/task-"),
            "{path}"
        );
        assert!(
            e["reason"]
                .as_str()
                .expect("reason")
                .starts_with("the name "),
            "{e}"
        );
    }
    let assigned: Vec<_> = of(&evs, "task.assigned")
        .into_iter()
        .filter(|e| e["smith"] != "smith-root")
        .collect();
    assert_eq!(assigned.len(), 1, "[{mode}] {assigned:#?}");
    assert_eq!(
        assigned[0]["path"],
        "smiths/smith-root/children/smith-001/inbox/task-good_1.md"
    );
    // Rewriting an ignored name is not journaled again.
    launcher
        .run_as(
            &m,
            m.path(),
            "smith-root",
            &[
                "sh",
                "-c",
                "echo again > 'smiths/smith-root/children/smith-001/inbox/task-with space.md'",
            ],
        )
        .expect_ok("rewrite");
    // The writer's why names a name that works.
    let why = launcher
        .run_as(&m, m.path(), "smith-root", &["cat", ".smithfs/why"])
        .expect_ok("why");
    assert!(why.contains("Rename it to task-"), "[{mode}] {why}");
    assert!(why.contains("rule: task-name"), "[{mode}] {why}");
    // Nothing a smith named was executed, by any hook.
    for f in &pwned {
        assert!(
            !f.exists(),
            "[{mode}] a task name was executed: {}",
            f.display()
        );
    }
    let text = std::fs::read_to_string(&log).expect("hooks.log");
    let mount = m.path().display().to_string();
    let child_dir = format!("{mount}/smiths/smith-root/children/smith-001");
    let good = format!("{child_dir}/inbox/task-good_1.md");
    let mut seen_assigned = false;
    for line in text.lines() {
        let f: Vec<&str> = line.split('|').collect();
        if f.len() != 12 || (f[0] == "task.assigned" && f[1] == "smith-root") {
            // A newline in a name splits the line; its fields are still literal text. (The
            // root's own tasks are the loopback agent's.)
            continue;
        }
        match f[0] {
            "task.assigned" => {
                seen_assigned = true;
                assert_eq!(
                    &f[1..],
                    [
                        "smith-root/smith-001",
                        "",
                        good.as_str(),
                        "",
                        "smiths/smith-root/children/smith-001/inbox/task-good_1.md",
                        mount.as_str(),
                        child_dir.as_str(),
                        good.as_str(),
                        "smith-001",
                        "smith-root/smith-001",
                        "1",
                    ],
                    "{line}"
                );
            }
            "task.ignored" => {
                assert_eq!(f[1], "smith-root/smith-001", "{line}");
                assert!(
                    f[5].starts_with("smiths/smith-root/children/smith-001/inbox/task-"),
                    "{line}"
                );
                // {task_file} is only ever a name that passes the rule.
                assert!(f[3].is_empty() || f[3] == good, "{line}");
            }
            other => panic!("unexpected hook event {other}: {line}"),
        }
    }
    assert!(seen_assigned, "{text}");
}

#[test]
fn hostile_task_names_cgroup() {
    hostile_names("cgroup", Launcher::Local);
}

#[test]
fn hostile_task_names_ancestry() {
    hostile_names("ancestry", Launcher::Local);
}

#[test]
fn hostile_task_names_loopback_cgroup() {
    hostile_names("cgroup", Launcher::Loopback);
}

#[test]
fn hostile_task_names_loopback_ancestry() {
    hostile_names("ancestry", Launcher::Loopback);
}

/// Every catchable signal the keeper can get, by number.
fn catchable() -> Vec<i32> {
    let mut v: Vec<i32> = (1..32)
        .filter(|s| ![libc::SIGKILL, libc::SIGSTOP].contains(s))
        .collect();
    v.extend([libc::SIGRTMIN(), libc::SIGRTMIN() + 1, libc::SIGRTMAX()]);
    v
}

#[test]
fn keeper_survives_every_catchable_signal() {
    // The command writes to a host temp dir: outside a sandboxed run's view (a sandboxed
    // keeper's signals: tests/e2e/sandbox_run.rs).
    let m = mount_with(r#"{"sandbox": {"enabled": false}}"#, "ancestry");
    let out = tempfile::tempdir().expect("tempdir");
    let mut keepers = Vec::new();
    for sig in catchable() {
        let file = out.path().join(format!("whoami-{sig}"));
        // The command's background child outlives it (and the signal) and then reads whoami.
        let script = format!(
            "(sleep 2; cat \"$SMITH_MOUNT/.smithfs/whoami\" > '{}') & exec sleep 30",
            file.display()
        );
        let child = Command::new(SMITHFS)
            .args(["run", "--mount"])
            .arg(m.path())
            .args(["--smith", "smith-root", "--", "sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("smithfs run");
        keepers.push((sig, child, file));
    }
    // Signal each keeper once its command runs (the keeper has forked it).
    for (sig, child, _) in &keepers {
        let pid = child.id();
        // The command has forked its background child and exec'd `sleep` (a signal that killed
        // `sh` before the fork would leave nothing to check).
        poll_until(Duration::from_secs(60), "the keeper's command", || {
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .ok()
                .and_then(|c| c.split_whitespace().next().map(str::to_owned))
                .and_then(|c| std::fs::read_to_string(format!("/proc/{c}/comm")).ok())
                .is_some_and(|comm| comm.trim() == "sleep")
        });
        // SAFETY: signalling our own child process.
        assert_eq!(unsafe { libc::kill(pid as i32, *sig) }, 0, "kill {sig}");
    }
    let deadline = Instant::now() + Duration::from_secs(90);
    for (sig, mut child, file) in keepers {
        poll_until(
            deadline.saturating_duration_since(Instant::now()),
            "the background child's whoami",
            || std::fs::metadata(&file).is_ok_and(|md| md.len() > 0),
        );
        let text = std::fs::read_to_string(&file).expect("whoami");
        assert!(
            text.contains("full id: smith-root\n"),
            "signal {sig}: the background child is not smith-root:\n{text}"
        );
        // The keeper is still there: TERM is forwarded to the command, and the keeper exits
        // with its status once nothing of it is left.
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let _ = child.wait();
    }
}

/// A process bound to `full_id` that is refused, in a loop, for `secs` seconds.
fn storm(m: &TestMount, full_id: &str, secs: u64) -> std::process::Child {
    let code = format!(
        "import time, os\n\
         end = time.time() + {secs}\n\
         while time.time() < end:\n\
         \x20   try: os.open('smiths/smith-root/private/secret', os.O_RDONLY)\n\
         \x20   except OSError: pass\n"
    );
    Command::new(SMITHFS)
        .args(["run", "--mount"])
        .arg(m.path())
        .args(["--smith", full_id, "--", "python3", "-c", &code])
        .current_dir(m.path())
        .stdin(Stdio::null())
        .spawn()
        .expect("storm")
}

fn state_files(m: &TestMount) -> Vec<(String, u64)> {
    // The store's `.smithfs-state/` (hidden from the mount): read after unmounting.
    let dir = m.path().join(".smithfs-state");
    let mut v: Vec<(String, u64)> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| {
                    (
                        e.file_name().to_string_lossy().into_owned(),
                        e.metadata().map_or(0, |md| md.len()),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn denial_storm_keeps_the_journal_bounded_and_resume_knows_who_failed() {
    let config = r#"{"agent": {"command": ["sh", "-c", "exit 3"], "retries": 0},
                     "journal": {"max_bytes": "48K", "keep": 3}}"#;
    let mut m = mount_with(config, "cgroup");
    m.sh_ok("for i in 1 2 3 4 5; do mkdir smiths/smith-root/children/smith-00$i; done");
    m.sh_ok("echo secret > smiths/smith-root/private/secret");
    m.sh_ok("echo 'fail' > smiths/smith-root/children/smith-005/inbox/task-1.md");
    let status = |m: &TestMount| {
        let text = std::fs::read_to_string(m.path().join(".smithfs/status.json")).expect("status");
        let v: serde_json::Value = serde_json::from_str(&text).expect("json");
        v["smiths"]
            .as_array()
            .expect("smiths")
            .iter()
            .find(|s| s["full_id"] == "smith-root/smith-005")
            .map(|s| s["state"].as_str().unwrap_or("").to_string())
    };
    poll_until(Duration::from_secs(20), "smith-005 to fail", || {
        status(&m).as_deref() == Some("failed")
    });
    let secs = 12;
    let storms: Vec<_> = (1..=4)
        .map(|i| storm(&m, &format!("smith-root/smith-00{i}"), secs))
        .collect();
    // Meanwhile other events: the operator makes grandchildren of smith-005.
    let start = Instant::now();
    let mut made = Vec::new();
    for i in 1..=4 {
        while start.elapsed() < Duration::from_secs(secs / 2 + i) {
            std::thread::sleep(Duration::from_millis(100));
        }
        m.sh_ok(&format!(
            "mkdir smiths/smith-root/children/smith-005/children/smith-00{i}"
        ));
        made.push(format!("smith-root/smith-005/smith-00{i}"));
    }
    for mut s in storms {
        let _ = s.wait();
    }
    // The suppressed count of the last second is written soon after it.
    std::thread::sleep(Duration::from_millis(1500));
    let evs = events(&m);
    let denied = of(&evs, "access.denied").len();
    let suppressed = of(&evs, "access.denied.suppressed");
    assert!(!suppressed.is_empty(), "no access.denied.suppressed");
    let counted: u64 = suppressed
        .iter()
        .map(|e| e["count"].as_u64().unwrap_or(0))
        .sum();
    assert!(counted > 1000, "only {counted} suppressed");
    assert!(
        of(&evs, "trigger.dropped").is_empty(),
        "a trigger was dropped"
    );
    // Per identity and second, at most 20 in full.
    let mut per: std::collections::HashMap<(String, String), u32> = Default::default();
    for e in of(&evs, "access.denied") {
        let sec = e["ts"].as_str().unwrap_or("")[..19].to_string();
        *per.entry((e["smith"].to_string(), sec)).or_default() += 1;
    }
    assert!(per.values().all(|n| *n <= 20), "{per:?}");
    let created: Vec<&str> = of(&evs, "smith.created")
        .iter()
        .filter_map(|e| e["smith"].as_str())
        .collect();
    for id in &made {
        assert!(
            created.contains(&id.as_str()),
            "{id} missing from the journal"
        );
    }
    eprintln!("storm: {denied} access.denied in full, {counted} suppressed");
    // After the unmount the store shows the files: bounded, rotated, with the snapshot.
    m.umount();
    let files = state_files(&m);
    eprintln!("state files: {files:?}");
    let journal: u64 = files
        .iter()
        .filter(|(n, _)| n.starts_with("events.jsonl"))
        .map(|(_, l)| *l)
        .sum();
    assert!(journal <= 4 * 48 * 1024, "journal is {journal} bytes");
    assert!(
        files.iter().any(|(n, _)| n == "events.jsonl.3"),
        "{files:?}"
    );
    assert!(
        files.iter().any(|(n, _)| n == "journal-state.json"),
        "{files:?}"
    );
    // The run.exited of smith-005's failure was rotated away …
    let kept: String = files
        .iter()
        .filter(|(n, _)| n.starts_with("events.jsonl"))
        .map(|(n, _)| {
            std::fs::read_to_string(m.path().join(".smithfs-state").join(n)).unwrap_or_default()
        })
        .collect();
    assert!(
        !kept.contains("\"run.exited\""),
        "the failure is still in a journal file; make the storm longer"
    );
    // … and still a resumed daemon knows that smith-005 failed.
    let mut mount = Command::new(SMITHFS);
    mount
        .arg("mount")
        .arg(m.path())
        .args(["--resume", "--allow-other", "--identity", "cgroup"]);
    run(&mut mount).expect_ok("mount --resume");
    poll_until(Duration::from_secs(10), "status after --resume", || {
        std::fs::metadata(m.path().join(".smithfs/status.json")).is_ok()
    });
    assert_eq!(status(&m).as_deref(), Some("failed"));
}

/// Peak and current resident set of `pid`, KiB.
fn rss_kib(pid: i32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let get = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    (get("VmHWM:"), get("VmRSS:"))
}

#[test]
fn a_100_gib_sparse_result_costs_nothing() {
    let m = TestMount::with(MountOpts {
        allow_other: true,
        foreground: true,
        ..MountOpts::default()
    });
    let pid = m.daemon_pid().expect("daemon pid");
    let (hwm_before, _) = rss_kib(pid);
    let result: PathBuf = m.path().join("smiths/smith-root/outbox/result.md");
    let started = Instant::now();
    m.sh_ok(
        "truncate -s 100G smiths/smith-root/outbox/result.md && printf tail | dd \
         of=smiths/smith-root/outbox/result.md bs=1 seek=$((100*1024*1024*1024-4)) \
         conv=notrunc status=none",
    );
    let fin = m.path().join("results/final.md");
    poll_until(Duration::from_secs(60), "results/final.md", || {
        std::fs::metadata(&fin).is_ok_and(|md| md.len() == 100 << 30)
    });
    let took = started.elapsed();
    let md = std::fs::metadata(&fin).expect("final.md");
    let (hwm_after, _) = rss_kib(pid);
    eprintln!(
        "100 GiB sparse result: copied in {took:?}, final.md uses {} KiB, daemon peak RSS {} → {} KiB",
        md.blocks() / 2,
        hwm_before,
        hwm_after
    );
    assert!(
        md.blocks() * 512 < 1 << 20,
        "final.md uses {} blocks",
        md.blocks()
    );
    assert!(
        hwm_after < hwm_before + 64 * 1024,
        "the daemon grew from {hwm_before} to {hwm_after} KiB"
    );
    poll_until(
        Duration::from_secs(60),
        "the data at the end of final.md",
        || m.sh_ok("tail -c 4 results/final.md") == "tail",
    );
    assert!(std::fs::metadata(&result).is_ok());
}

/// A root agent the scheduler starts (cgroup and ancestry mode) cannot leave its smith: every
/// route of tests/fixtures/escapes.sh fails, its capabilities lack `CAP_SYS_ADMIN` and
/// `CAP_SYS_PTRACE`, and it stays `smith-root` (docs/PROTOCOL-NOTES.md H13); with
/// `agent.confine: false` the same agent keeps the daemon's capabilities (the switch works).
pub(crate) fn agent_is_confined(mode: &'static str, launcher: Launcher) {
    const PROBE: &str = "{ awk '$1 == \"CapEff:\" { print \"CapEff: \" $2 }' /proc/self/status; \
                         cat \"$SMITH_MOUNT/.smithfs/whoami\"; } > outbox/result.md";
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/escapes.sh");
    for confine in [true, false] {
        let config = serde_json::json!({
            "agent": {
                // Unconfined, only the capabilities are read: the attempts would change the host.
                "command": ["bash", "-c", if confine {
                    format!("bash {} > outbox/result.md 2>&1", script.display())
                } else {
                    PROBE.to_string()
                }],
                "confine": confine,
            },
            // The confinement of root runs: the mode without the sandbox (§12).
            "sandbox": {"enabled": false},
        });
        let m = mount_for(launcher, &launcher.config(&config).to_string(), mode);
        let mode = format!("{mode}, {}", launcher.kind());
        for c in ["smith-001", "smith-002"] {
            std::fs::create_dir(m.path().join("smiths/smith-root/children").join(c))
                .expect("mkdir");
        }
        std::fs::write(
            m.path().join("smiths/smith-root/inbox/task-1.md"),
            "escape\n",
        )
        .expect("task");
        let result = m.path().join("smiths/smith-root/outbox/result.md");
        let out = poll_until(60, "the agent's result.md", || {
            std::fs::read_to_string(&result)
                .ok()
                .filter(|t| t.contains("full id:"))
        });
        let eff = out
            .lines()
            .find_map(|l| l.strip_prefix("CapEff: "))
            .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
            .expect("CapEff line");
        if confine {
            assert!(
                !out.contains("ESCAPED") && !out.contains("MISSING"),
                "[{mode}] a confined root agent left its smith:\n{out}"
            );
            assert_eq!(eff & ((1 << 21) | (1 << 19)), 0, "[{mode}]\n{out}");
            assert!(out.contains("full id: smith-root\n"), "[{mode}]\n{out}");
        } else {
            assert_eq!(eff & (1 << 21), 1 << 21, "[{mode}] confine: false\n{out}");
        }
    }
}

#[test]
fn root_agents_are_confined_cgroup() {
    agent_is_confined("cgroup", Launcher::Local);
}

#[test]
fn root_agents_are_confined_loopback_cgroup() {
    agent_is_confined("cgroup", Launcher::Loopback);
}

#[test]
fn root_agents_are_confined_ancestry() {
    agent_is_confined("ancestry", Launcher::Local);
}

#[test]
fn root_agents_are_confined_loopback_ancestry() {
    agent_is_confined("ancestry", Launcher::Loopback);
}

/// `smithfs run` hands CMD only stdin, stdout and stderr (docs/PROTOCOL-NOTES.md H14): a
/// directory and a file the operator's shell holds open (here fds 7 and 8, outside the mount)
/// do not reach the bound command, in either identity mode; a full id the status does not list
/// is passed to the daemon, and a smith it does not know is a usage error (exit 2).
fn run_passes_only_stdio(mode: &'static str) {
    let m = mount_with("{}", mode);
    let outside = tempfile::tempdir().expect("tempdir");
    let script = format!(
        "exec 7<{} 8>{}/f; exec {} run --mount {} --smith smith-root -- sh -c \
         'for f in 7 8; do [ -e /proc/self/fd/$f ] && echo open $f; done; echo end'",
        outside.path().display(),
        outside.path().display(),
        SMITHFS,
        m.path().display()
    );
    let out = run(Command::new("bash").arg("-c").arg(&script)).expect_ok("smithfs run");
    assert_eq!(
        out, "end\n",
        "[{mode}] an operator's fd reached the command"
    );
    let r = run_as(m.path(), "smith-root/smith-007", &["true"]);
    assert_eq!(r.code, Some(2), "[{mode}] {r:?}");
    assert!(
        r.stderr.contains("no such smith smith-root/smith-007"),
        "{r:?}"
    );
    // A child made a moment ago: bound by its full id at once.
    std::fs::create_dir(m.path().join("smiths/smith-root/children/smith-001")).expect("mkdir");
    let who = run_as(
        m.path(),
        "smith-root/smith-001",
        &["cat", &m.path().join(".smithfs/whoami").to_string_lossy()],
    )
    .expect_ok("run as a new child");
    assert!(who.contains("full id: smith-root/smith-001\n"), "{who}");
}

#[test]
fn smithfs_run_passes_only_stdio_cgroup() {
    run_passes_only_stdio("cgroup");
}

#[test]
fn smithfs_run_passes_only_stdio_ancestry() {
    run_passes_only_stdio("ancestry");
}

/// A run's agent holds no descriptor but 0, 1 and 2 (docs/SPEC.md §5, notes S19), sandboxed and
/// not, started locally or by `smithfs attach` (notes R56: attach's stop pipe reached an
/// unsandboxed agent as fds 7 and 8, its write end enough to stop the run's forwarding or forge
/// its exit report).
pub(crate) fn agents_hold_only_stdio(mode: &'static str, launcher: Launcher) {
    for sandbox in [true, false] {
        let config = serde_json::json!({
            "agent": {"command": ["sh", "-c",
                "ls -l /proc/self/fd > private/fds; mv private/fds outbox/result.md"],
                "retries": 0},
            "sandbox": {"enabled": sandbox},
        });
        let m = launcher.mount(&config, mode);
        std::fs::write(m.path().join("smiths/smith-root/inbox/task-1.md"), "fds\n").expect("task");
        let result = m.path().join("smiths/smith-root/outbox/result.md");
        let out = poll_until(60, "the agent's result.md", || {
            std::fs::read_to_string(&result)
                .ok()
                .filter(|t| !t.is_empty())
        });
        // What `ls` inherited (its stdout the file), less the directory it lists.
        let fds: Vec<u32> = out
            .lines()
            .filter(|l| !(l.contains(" -> /proc/") && l.ends_with("/fd")))
            .filter_map(|l| {
                l.split_once(" -> ")?
                    .0
                    .split_whitespace()
                    .last()?
                    .parse()
                    .ok()
            })
            .collect();
        assert!(
            fds == [0, 1, 2],
            "[{mode}, {}] sandbox {sandbox}: the agent holds {out:?}",
            launcher.kind()
        );
    }
}

#[test]
fn agents_hold_only_stdio_cgroup() {
    agents_hold_only_stdio("cgroup", Launcher::Local);
}

#[test]
fn agents_hold_only_stdio_ancestry() {
    agents_hold_only_stdio("ancestry", Launcher::Local);
}

#[test]
fn agents_hold_only_stdio_loopback_cgroup() {
    agents_hold_only_stdio("cgroup", Launcher::Loopback);
}

#[test]
fn agents_hold_only_stdio_loopback_ancestry() {
    agents_hold_only_stdio("ancestry", Launcher::Loopback);
}

/// A process outside every run (killed and reaped on drop).
struct Outside(std::process::Child);

impl Drop for Outside {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The kernel-enforced layers (docs/SPEC.md §12, issue 27) from a run the scheduler started and
/// from `smithfs run --smith`: an abstract unix socket the test listens on is out of reach, a
/// process outside the run whose pid it reads from a pid file in a writable path (and its own
/// init) cannot be signalled, `add_key`, `keyctl`, `bpf`, `perf_event_open`, `userfaultfd`,
/// `open_by_handle_at` answer EPERM, `unshare -U` fails, a write the mode bits allow outside the
/// writable set is refused; the filter is installed (`Seccomp: 2`).
fn layers_hold(mode: &'static str, launcher: Launcher) {
    if !is_root() {
        eprintln!("skipped: the sandbox needs root");
        return;
    }
    use std::os::linux::net::SocketAddrExt;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/escapes.sh");
    let scratch = tempfile::Builder::new()
        .prefix("smithfs-layers-")
        .tempdir()
        .expect("tempdir");
    let share = scratch.path().join("share");
    std::fs::create_dir(&share).expect("mkdir share");
    std::fs::set_permissions(
        scratch.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    std::fs::set_permissions(&share, std::os::unix::fs::PermissionsExt::from_mode(0o777))
        .expect("chmod");
    let victim = Outside(
        Command::new("sleep")
            .arg("300")
            .spawn()
            .expect("spawn sleep"),
    );
    let pidfile = share.join("victim.pid");
    std::fs::write(&pidfile, victim.0.id().to_string()).expect("pid file");
    let name = format!("smithfs-layers-{}-{mode}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
        .expect("abstract address");
    let listener = std::os::unix::net::UnixListener::bind_addr(&addr).expect("listen");
    listener.set_nonblocking(true).expect("nonblocking");
    let vars = [
        ("LAYERS", "1".to_string()),
        ("ABSTRACT", name.clone()),
        ("PIDFILE", pidfile.to_string_lossy().into_owned()),
    ];
    let env: serde_json::Map<String, serde_json::Value> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::Value::from(v.as_str())))
        .collect();
    let config = serde_json::json!({
        "agent": { "command": ["/bin/bash", script], "env": env, "retries": 0 },
        "sandbox": { "writable": [share] },
    });
    let m = launcher.mount(&config, mode);
    let mode = format!("{mode}, {}", launcher.kind());
    std::fs::write(m.path().join("smiths/smith-root/inbox/task-1.md"), "go\n").expect("task");
    let (log, meta) = ended_run(&m, "smiths/smith-root", 1, 90);
    assert!(meta["error"].is_null(), "[{mode}] {meta}\n{log}");
    // `smithfs run` binds a process on this host whatever the launcher: its half is the local
    // test's.
    let mut cmd = Command::new(SMITHFS);
    cmd.args(["run", "--mount"])
        .arg(m.path())
        .args(["--smith", "smith-root", "--", "/bin/bash"])
        .arg(&script)
        .current_dir(scratch.path());
    for (k, v) in &vars {
        cmd.env(k, v);
    }
    let out = match launcher {
        Launcher::Local => run(&mut cmd),
        Launcher::Loopback | Launcher::Slurm(_) => Run {
            code: None,
            stdout: log.clone(),
            stderr: String::new(),
        },
    };
    for (what, text) in [("scheduler", &log), ("smithfs run", &out.stdout)] {
        assert!(
            !text.contains("ESCAPED") && !text.contains("MISSING"),
            "[{mode}, {what}] a layer let it through:\n{text}\n{}",
            out.stderr
        );
        assert!(
            text.contains("Seccomp: 2\n") && text.contains("Seccomp_filters: 1\n"),
            "[{mode}, {what}] no seccomp filter:\n{text}"
        );
        assert!(
            text.contains("full id: smith-root\n"),
            "[{mode}, {what}]\n{text}"
        );
    }
    assert!(
        matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "[{mode}] a run connected to the abstract socket"
    );
    // SAFETY: signal 0 to our own unreaped child.
    let alive = unsafe { libc::kill(victim.0.id() as i32, 0) } == 0;
    assert!(alive, "[{mode}] the process outside the run died");
}

#[test]
fn kernel_layers_hold_cgroup() {
    layers_hold("cgroup", Launcher::Local);
}

#[test]
fn kernel_layers_hold_loopback_cgroup() {
    layers_hold("cgroup", Launcher::Loopback);
}

#[test]
fn kernel_layers_hold_ancestry() {
    layers_hold("ancestry", Launcher::Local);
}

#[test]
fn kernel_layers_hold_loopback_ancestry() {
    layers_hold("ancestry", Launcher::Loopback);
}

/// `sandbox.network: "none"` with `sandbox.user_namespaces: true` (docs/SPEC.md §12): a server on
/// the host's 127.0.0.1 is unreachable, one the run starts on its own loopback is reachable,
/// `lo` is its only interface; a user namespace can be made, and `mount` inside it is still
/// refused by the filter.
fn network_none(mode: &'static str, launcher: Launcher) {
    if !is_root() {
        eprintln!("skipped: the sandbox needs root");
        return;
    }
    let host = std::net::TcpListener::bind("127.0.0.1:0").expect("listen on the host");
    host.set_nonblocking(true).expect("nonblocking");
    let port = host.local_addr().expect("addr").port();
    let agent = format!(
        r#"(exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo "host loopback: reached" || echo "host loopback: unreachable"
perl -MIO::Socket::INET -e '$l = IO::Socket::INET->new(Listen => 1, LocalAddr => "127.0.0.1", LocalPort => {port}) or die "listen: $!";
  IO::Socket::INET->new(PeerAddr => "127.0.0.1", PeerPort => {port}) or die "connect: $!"; print "own loopback: reached\n"'
echo "interfaces: $(awk -F: 'NR > 2 {{ gsub(/ /, "", $1); printf "%s ", $1 }}' /proc/net/dev)"
unshare -U true && echo "userns: made"
d=$(mktemp -d)
unshare -Urm mount -t tmpfs none "$d" 2>/dev/null && echo "ESCAPED: mount in a user namespace" || echo "mount in userns: refused"
"#
    );
    let config = serde_json::json!({
        "agent": { "command": ["/bin/bash", "-c", agent], "retries": 0 },
        "sandbox": { "network": "none", "user_namespaces": true },
    });
    let m = launcher.mount(&config, mode);
    let mode = format!("{mode}, {}", launcher.kind());
    std::fs::write(m.path().join("smiths/smith-root/inbox/task-1.md"), "go\n").expect("task");
    let (log, meta) = ended_run(&m, "smiths/smith-root", 1, 90);
    assert!(meta["error"].is_null(), "[{mode}] {meta}\n{log}");
    for want in [
        "host loopback: unreachable\n",
        "own loopback: reached\n",
        "interfaces: lo \n",
        "userns: made\n",
        "mount in userns: refused\n",
    ] {
        assert!(log.contains(want), "[{mode}] no {want:?} in:\n{log}");
    }
    assert!(!log.contains("ESCAPED"), "[{mode}]\n{log}");
    assert!(
        matches!(host.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "[{mode}] the run reached the host's loopback"
    );
}

#[test]
fn network_none_cgroup() {
    network_none("cgroup", Launcher::Local);
}

#[test]
fn network_none_loopback_cgroup() {
    network_none("cgroup", Launcher::Loopback);
}

#[test]
fn network_none_ancestry() {
    network_none("ancestry", Launcher::Local);
}

#[test]
fn network_none_loopback_ancestry() {
    network_none("ancestry", Launcher::Loopback);
}

/// The programs agents are made of run unchanged under every layer (docs/SPEC.md §12): bash with
/// background jobs, node (threads, a child process, libuv's file I/O), git (init, commit, log in
/// the private /tmp), where this host has them.
#[test]
fn runtimes_run_under_every_layer() {
    if !is_root() {
        eprintln!("skipped: the sandbox needs root");
        return;
    }
    let agent = r#"set -e
sleep 0.1 & wait && echo "bash: ok"
if command -v node >/dev/null; then
  node -e 'const {Worker} = require("worker_threads");
    const w = new Worker("require(\"worker_threads\").parentPort.postMessage(6 * 7)", {eval: true});
    w.on("message", n => require("fs").readFile("/etc/hostname", () =>
      console.log("node: " + n + " " + require("child_process").execFileSync("echo", ["spawned"]).toString().trim())));'
else echo "node: absent"; fi
if command -v git >/dev/null; then
  cd "$(mktemp -d)" && git init -q && echo x > f && git add f &&
  git -c user.name=a -c user.email=a@b commit -qm one && echo "git: $(git log --format=%s)"
else echo "git: absent"; fi
"#;
    // A file (agent.command's braces would be placeholders), bound into the view.
    let dir = tempfile::Builder::new()
        .prefix("smithfs-runtimes-")
        .tempdir()
        .expect("tempdir");
    let script = dir.path().join("agent.sh");
    std::fs::write(&script, agent).expect("agent.sh");
    let config = serde_json::json!({
        "agent": { "command": ["/bin/bash", script], "retries": 0 },
    });
    let m = TestMount::with_config(&config, "cgroup", Vec::new());
    std::fs::write(m.path().join("smiths/smith-root/inbox/task-1.md"), "go\n").expect("task");
    let (log, meta) = ended_run(&m, "smiths/smith-root", 1, 90);
    assert!(meta["error"].is_null(), "{meta}\n{log}");
    assert!(log.contains("bash: ok\n"), "{log}");
    assert!(
        log.contains("node: 42 spawned\n") || log.contains("node: absent\n"),
        "{log}"
    );
    assert!(
        log.contains("git: one\n") || log.contains("git: absent\n"),
        "{log}"
    );
}

/// `sandbox.require` (docs/SPEC.md §12, notes SB8): with every named protection on this host the
/// mount goes on; with the sandbox off (`sandbox.enabled: false`) a `require` refuses the mount
/// in one line, since no run would get what it names.
#[test]
fn sandbox_require_refuses_a_mount_without_it() {
    if !is_root() {
        eprintln!("skipped: the sandbox needs root");
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("smithfs-require-")
        .tempdir()
        .expect("tempdir");
    let d = dir.path().join("m");
    smithfs([std::ffi::OsStr::new("init"), d.as_os_str()]).expect_ok("init");
    let config = |enabled: bool| {
        let c = serde_json::json!({
            "sandbox": { "enabled": enabled, "require": ["seccomp", "landlock"] }
        });
        std::fs::write(d.join("config.json"), c.to_string()).expect("config.json");
    };
    config(false);
    let r = run(Command::new(SMITHFS)
        .arg("mount")
        .arg(&d)
        .arg("--allow-other"));
    if r.code == Some(0) {
        let _ = smithfs([std::ffi::OsStr::new("umount"), d.as_os_str()]);
        panic!("mounted with sandbox.require and no sandbox: {r:?}");
    }
    assert!(
        r.stderr.contains("sandbox.require") && r.stderr.lines().count() == 1,
        "{r:?}"
    );
    // With the sandbox applied, on a host whose doctor says it gives both: it mounts.
    let doctor = smithfs(["doctor", "--json"]);
    let checks: Vec<serde_json::Value> = serde_json::from_str(&doctor.stdout).expect("doctor");
    let gives = |name: &str| {
        checks
            .iter()
            .any(|c| c["check"] == name && c["status"] == "ok")
    };
    if !(gives("landlock") && gives("seccomp")) {
        eprintln!("this host lacks Landlock ABI 2 or seccomp: the mounting half not tried");
        return;
    }
    config(true);
    let ok = run(Command::new(SMITHFS)
        .arg("mount")
        .arg(&d)
        .arg("--allow-other"));
    let _ = smithfs([std::ffi::OsStr::new("umount"), d.as_os_str()]);
    assert_eq!(ok.code, Some(0), "{ok:?}");
}

/// A run starts with the umask of whoever mounted, not the daemon's 0 (docs/PROTOCOL-NOTES.md
/// H16): with the mount made under umask 027, the agent (sandboxed, both identity modes, and
/// unsandboxed) reports 0027 and creates its files 0640 — a file it makes is not writable by
/// every other uid on the host.
pub(crate) fn runs_take_the_mounters_umask(mode: &'static str, launcher: Launcher) {
    for sandbox in [true, false] {
        let config = serde_json::json!({
            "agent": {"command": ["sh", "-c",
                "umask > private/mask; : > private/f; stat -c %a private/f >> private/mask; \
                 cp private/mask outbox/result.md"]},
            "sandbox": {"enabled": sandbox},
        });
        let mut m = mount_for(launcher, &launcher.config(&config).to_string(), mode);
        m.umount();
        // SAFETY: umask has no preconditions. Only the mount (the daemon it starts) runs under
        // 027: the test's directories stay searchable by the agents' uid.
        let old = unsafe { libc::umask(0o027) };
        m.mount();
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        std::fs::write(m.path().join("smiths/smith-root/inbox/task-1.md"), "mask\n").expect("task");
        let result = m.path().join("smiths/smith-root/outbox/result.md");
        let out = poll_until(60, "the agent's result.md", || {
            std::fs::read_to_string(&result)
                .ok()
                .filter(|t| t.lines().count() == 2)
        });
        assert_eq!(
            out,
            "0027\n640\n",
            "[{mode}, {}] sandbox {sandbox}",
            launcher.kind()
        );
    }
}

#[test]
fn runs_take_the_mounters_umask_cgroup() {
    runs_take_the_mounters_umask("cgroup", Launcher::Local);
}

#[test]
fn runs_take_the_mounters_umask_loopback_cgroup() {
    runs_take_the_mounters_umask("cgroup", Launcher::Loopback);
}

#[test]
fn runs_take_the_mounters_umask_ancestry() {
    runs_take_the_mounters_umask("ancestry", Launcher::Local);
}

#[test]
fn runs_take_the_mounters_umask_loopback_ancestry() {
    runs_take_the_mounters_umask("ancestry", Launcher::Loopback);
}
