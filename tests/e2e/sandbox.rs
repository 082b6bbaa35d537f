//! The sandbox (issue 26, docs/SPEC.md §12) with real processes on real mounts, in both identity
//! modes, for runs the scheduler starts and for `smithfs run --smith`: every route of
//! tests/fixtures/escapes.sh fails (devices, other processes, programs and files outside the
//! mount, /proc/sys, /sys, cgroup files, mount, setuid), the run is the agents' uid with no other
//! group, no capability and `no_new_privs`; `kill -9 -1` kills only the run's own processes;
//! `/tmp` is bounded by `sandbox.tmp_size`; an agent program under a 0700 directory runs; a
//! sandbox that cannot be built never starts the run and says why.
//!
//! The probes print on stdout (the run's `messages.log`).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::*;

/// The agents' uid these tests pin with `sandbox.uid` (docs/SPEC.md §12; without it the daemon
/// would take `SUDO_UID` or allocate one, which `smithfs whoami` shows as `agents uid`).
fn agents_uid() -> u32 {
    65534
}

/// `config` with `sandbox.uid` set to [`agents_uid`] unless it names one.
fn pinned(config: &serde_json::Value) -> serde_json::Value {
    let mut c = config.clone();
    if c["sandbox"]["uid"].is_null() {
        c["sandbox"]["uid"] = serde_json::json!(agents_uid());
    }
    c
}

/// A sandboxed mount in identity `mode` with `config` in config.json.
fn mount_with(config: &serde_json::Value, mode: &'static str) -> TestMount {
    TestMount::with_config(&pinned(config), mode, Vec::new())
}

/// A sibling: `sleep` run as smith-root/smith-001 through `smithfs run` (sandboxed too); killed
/// and reaped on drop.
struct Sibling(Child);

impl Sibling {
    fn start(m: &TestMount) -> Sibling {
        std::fs::create_dir_all(m.path().join("smiths/smith-root/children/smith-001"))
            .expect("mkdir smith-001");
        let c = Command::new(SMITHFS)
            .args(["run", "--mount"])
            .arg(m.path())
            .args(["--smith", "smith-root/smith-001", "--", "sleep", "120"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the sibling");
        Sibling(c)
    }
}

impl Drop for Sibling {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A setuid-root program that prints its effective uid, in `dir`; `None` without a C compiler.
fn setuid_prog(dir: &Path) -> Option<PathBuf> {
    let src = dir.join("euid.c");
    let bin = dir.join("euid");
    std::fs::write(
        &src,
        "#include <stdio.h>\n#include <unistd.h>\nint main(void){printf(\"%d\\n\",(int)geteuid());return 0;}\n",
    )
    .ok()?;
    let ok = Command::new("cc")
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .status()
        .ok()?
        .success();
    if !ok {
        return None;
    }
    Command::new("chmod").arg("4755").arg(&bin).status().ok()?;
    Some(bin)
}

/// The block device `path`'s filesystem is on (`findmnt`'s source, when it is a `/dev/` node).
fn store_device(path: &Path) -> Option<String> {
    let r = run(Command::new("findmnt")
        .args(["-n", "-o", "SOURCE", "-T"])
        .arg(path));
    let dev = r.stdout.trim().to_string();
    (r.ok() && dev.starts_with("/dev/") && Path::new(&dev).exists()).then_some(dev)
}

/// What every sandboxed probe must show (tests/fixtures/escapes.sh's output).
fn check(out: &str, what: &str) {
    check_nothing_escaped(out, agents_uid(), what);
    assert!(out.contains("full id: smith-root\n"), "[{what}]\n{out}");
}

/// Every route of escapes.sh fails from a run the scheduler started and from `smithfs run`.
fn nothing_escapes(mode: &'static str) {
    if !is_root() {
        eprintln!("skipped: the sandbox needs root");
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/escapes.sh");
    let scratch = tempfile::Builder::new()
        .prefix("smithfs-sandbox-")
        .tempdir()
        .expect("tempdir");
    let outside = scratch.path().join("outside.txt");
    std::fs::write(&outside, "world-readable, outside the view\n").expect("outside");
    let setuid = setuid_prog(scratch.path());
    // An operator's hook program (it runs as root at every run's start, outside the sandbox)
    // and the block device under the store: neither may be reachable from a run.
    let hook = scratch.path().join("hook.sh");
    std::fs::write(&hook, "#!/bin/sh\nexit 0\n").expect("hook");
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod hook");
    let blockdev = store_device(scratch.path()).unwrap_or_default();
    let mut readable = Vec::new();
    if let Some(s) = &setuid {
        readable.push(s.to_string_lossy().into_owned());
    }
    let env = serde_json::json!({
        "SANDBOXED": "1",
        "OUTSIDE": outside,
        "SMITHFS_BIN": SMITHFS,
        "AGENT_PROG": script,
        "HOOK_PROG": hook,
        "BLOCKDEV": blockdev,
        "SETUID_PROG": setuid.clone().unwrap_or_default(),
    });
    let config = serde_json::json!({
        "agent": { "command": ["/bin/bash", script], "env": env, "retries": 0 },
        "sandbox": { "readable": readable },
        "hooks": { "run.started": [[hook]] },
    });
    let m = mount_with(&config, mode);
    let sibling = Sibling::start(&m);
    std::fs::write(
        m.path().join("smiths/smith-root/inbox/task-1.md"),
        format!("escape\nsibling: {}\n", sibling.0.id()),
    )
    .expect("task");
    let (log, meta) = ended_run(&m, "smiths/smith-root", 1, 90);
    assert!(meta["error"].is_null(), "[{mode}] {meta}");
    check(&log, &format!("{mode}, scheduler"));

    let out = run(Command::new(SMITHFS)
        .args(["run", "--mount"])
        .arg(m.path())
        .args(["--smith", "smith-root", "--", "/bin/bash"])
        .arg(&script)
        .env("SANDBOXED", "1")
        .env("OUTSIDE", &outside)
        .env("SMITHFS_BIN", SMITHFS)
        .env("AGENT_PROG", &script)
        .env("HOOK_PROG", &hook)
        .env("BLOCKDEV", &blockdev)
        .env("SETUID_PROG", setuid.unwrap_or_default())
        .env("SIBLING", sibling.0.id().to_string())
        .current_dir(scratch.path()));
    check(&out.stdout, &format!("{mode}, smithfs run"));
}

#[test]
fn nothing_escapes_the_sandbox_cgroup() {
    nothing_escapes("cgroup");
}

#[test]
fn nothing_escapes_the_sandbox_ancestry() {
    nothing_escapes("ancestry");
}

/// `/tmp` is one tmpfs of `sandbox.tmp_size`; an agent program in a 0700 directory runs and is
/// the only thing of that directory the run sees; `smithfs run` from outside the view starts in
/// the smith dir; `USER` and `LOGNAME` are the passwd name of the uid.
fn view_limits(mode: &'static str) {
    if !is_root() {
        eprintln!("skipped: the sandbox needs root");
        return;
    }
    let home = tempfile::Builder::new()
        .prefix("smithfs-home-")
        .tempdir()
        .expect("tempdir");
    std::fs::set_permissions(
        home.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .expect("chmod 0700");
    let agent = home.path().join("agent.sh");
    std::fs::write(home.path().join("neighbour.txt"), "not in the view\n").expect("neighbour");
    std::fs::write(
        &agent,
        format!(
            "#!/bin/sh\necho \"ran as $(id -u) $USER $LOGNAME\"\n\
             ls {home} | sed 's/^/home: /'\n\
             dd if=/dev/zero of=/tmp/fill bs=1M count=64 2>/dev/null\n\
             echo \"tmp: $(($(stat -c %s /tmp/fill) / 1048576))\"\n\
             dd if=/dev/zero of=/dev/shm/fill bs=1M count=8 2>/dev/null || echo shm full\n\
             echo \"getent: $(getent passwd $(id -u) | cut -d: -f1)\"\n",
            home = home.path().display()
        ),
    )
    .expect("agent");
    std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let config = serde_json::json!({
        "agent": { "command": [agent], "retries": 0 },
        "sandbox": { "tmp_size": "16M" },
    });
    let m = mount_with(&config, mode);
    std::fs::write(m.path().join("smiths/smith-root/inbox/task-1.md"), "go\n").expect("task");
    let (log, meta) = ended_run(&m, "smiths/smith-root", 1, 90);
    assert!(meta["error"].is_null(), "[{mode}] {meta}\n{log}");
    let uid = agents_uid();
    let line = log
        .lines()
        .find(|l| l.starts_with("ran as "))
        .unwrap_or_else(|| panic!("[{mode}] the agent did not run:\n{log}"));
    assert!(
        line.starts_with(&format!("ran as {uid} ")),
        "[{mode}] {line}"
    );
    let name = line.split_whitespace().nth(3).unwrap_or_default();
    assert!(
        !name.is_empty() && line.ends_with(&format!("{name} {name}")),
        "{line}"
    );
    assert!(log.contains(&format!("getent: {name}")), "[{mode}]\n{log}");
    let homes: Vec<&str> = log
        .lines()
        .filter_map(|l| l.strip_prefix("home: "))
        .collect();
    assert_eq!(
        homes,
        ["agent.sh"],
        "[{mode}] only the program of the 0700 dir:\n{log}"
    );
    let tmp: u64 = log
        .lines()
        .find_map(|l| l.strip_prefix("tmp: "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("[{mode}] no tmp line:\n{log}"));
    assert!(
        tmp <= 16,
        "[{mode}] /tmp took {tmp} MiB of a 16 MiB tmp_size"
    );
    assert!(
        log.contains("shm full"),
        "[{mode}] /dev/shm shares the budget:\n{log}"
    );

    let outside = tempfile::tempdir().expect("tempdir");
    let pwd = run_as_sandboxed(&m, outside.path(), &["pwd"]).expect_ok("smithfs run pwd");
    assert_eq!(
        pwd.trim(),
        m.path().join("smiths/smith-root").to_string_lossy(),
        "[{mode}] a working directory outside the view starts in the smith dir"
    );
}

fn run_as_sandboxed(m: &TestMount, cwd: &Path, argv: &[&str]) -> Run {
    run(Command::new(SMITHFS)
        .args(["run", "--mount"])
        .arg(m.path())
        .args(["--smith", "smith-root", "--"])
        .args(argv)
        .current_dir(cwd))
}

#[test]
fn the_view_is_bounded_cgroup() {
    view_limits("cgroup");
}

#[test]
fn the_view_is_bounded_ancestry() {
    view_limits("ancestry");
}

/// A sandbox that cannot be built (here: a uid the credential drop refuses) never starts the
/// run: `spawn_error` names the step in the journal and `status`, and nothing ran.
#[test]
fn a_sandbox_that_cannot_be_built_runs_nothing() {
    if !is_root() {
        eprintln!("skipped: the sandbox needs root");
        return;
    }
    let marker = tempfile::tempdir().expect("tempdir");
    let flag = marker.path().join("ran");
    let config = serde_json::json!({
        "agent": { "command": ["/bin/touch", flag], "retries": 0 },
        "sandbox": { "uid": 4294967295u32 },
    });
    let m = mount_with(&config, "cgroup");
    std::fs::write(m.path().join("smiths/smith-root/inbox/task-1.md"), "go\n").expect("task");
    let (_, meta) = ended_run(&m, "smiths/smith-root", 1, 90);
    let err = meta["error"].as_str().unwrap_or_default().to_string();
    assert!(err.contains("dropping the agent's credentials"), "{meta}");
    assert!(!flag.exists(), "the program ran");
    let events = std::fs::read_to_string(m.path().join(".smithfs/events.jsonl")).expect("events");
    assert!(
        events.contains("spawn_error") && events.contains("dropping the agent's credentials"),
        "{events}"
    );
    let status =
        smithfs([std::ffi::OsStr::new("status"), m.path().as_os_str()]).expect_ok("status");
    assert!(status.contains("credentials"), "{status}");
}

/// `kill -9 -1` from a run kills only the run's own processes: the daemon, a process of the
/// agents' uid outside the run and the test's shell live on. Everything (the daemon included)
/// runs in a pid namespace of the test's own (`unshare -pf --mount-proc`), so a regression
/// kills the test, not the machine.
fn kill_all_kills_only_the_run(mode: &'static str) {
    if !is_root() {
        eprintln!("skipped: the sandbox needs root");
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("smithfs-killall-")
        .tempdir()
        .expect("tempdir");
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let config = serde_json::json!({
        "agent": {
            "command": ["/bin/sh", "-c",
                "sleep 100 & kill -9 -1; echo \"after: $?\"; wait; echo \"own child: gone\""],
            "retries": 0,
        },
    });
    let config = pinned(&config);
    let uid = agents_uid();
    let script = format!(
        r#"set -u
S={smithfs}; D={dir}
$S init $D/m >/dev/null || exit 3
cat > $D/m/config.json <<'JSON'
{config}
JSON
$S mount $D/m --allow-other --identity {mode} || exit 4
setpriv --reuid={uid} --regid={uid} --clear-groups sleep 300 & other=$!
echo go > $D/m/smiths/smith-root/inbox/task-1.md
meta=$D/m/smiths/smith-root/conversations/run-0001/meta.json
for i in $(seq 600); do grep -q '"end": "' $meta 2>/dev/null && break; sleep 0.1; done
cat $D/m/smiths/smith-root/conversations/run-0001/messages.log
kill -0 $other && echo "other: alive"
$S status $D/m >/dev/null && echo "daemon: alive"
$S umount $D/m
kill $other
"#,
        smithfs = SMITHFS,
        dir = dir.path().display(),
    );
    let out = run(Command::new("unshare")
        .args(["-pf", "--mount-proc", "bash", "-c"])
        .arg(&script));
    let text = format!("{}\n{}", out.stdout, out.stderr);
    assert!(
        text.contains("after: 0"),
        "[{mode}] the agent did not run kill -9 -1:\n{text}"
    );
    assert!(text.contains("own child: gone"), "[{mode}]\n{text}");
    assert!(
        text.contains("other: alive"),
        "[{mode}] a process outside the run died:\n{text}"
    );
    assert!(
        text.contains("daemon: alive"),
        "[{mode}] the daemon died:\n{text}"
    );
}

#[test]
fn kill_all_kills_only_the_run_cgroup() {
    kill_all_kills_only_the_run("cgroup");
}

#[test]
fn kill_all_kills_only_the_run_ancestry() {
    kill_all_kills_only_the_run("ancestry");
}

/// A smith cannot widen its child's view through the child's `config.json` (docs/SPEC.md §12:
/// a smith's own config may name only programs already readable): smith-root names, as
/// smith-001's agent, a host program outside the view, and `cat` of a world-readable host file
/// outside the view. Neither is reached: the first run fails to execute, the second prints no
/// byte of the file; the mount-wide agent (root's) ran as usual.
fn a_smith_cannot_name_host_files_for_its_child(mode: &'static str) {
    if !is_root() {
        eprintln!("skipped: the sandbox needs root");
        return;
    }
    let scratch = tempfile::Builder::new()
        .prefix("smithfs-widen-")
        .tempdir()
        .expect("tempdir");
    std::fs::set_permissions(
        scratch.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod 0755");
    let secret = scratch.path().join("secret.txt");
    std::fs::write(&secret, "HOST-SECRET-42\n").expect("secret");
    let prog = scratch.path().join("host-prog.sh");
    std::fs::write(&prog, "#!/bin/sh\necho HOST-PROGRAM-RAN\n").expect("prog");
    for f in [&secret, &prog] {
        std::fs::set_permissions(f, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
    }
    // smith-root makes two children, names a host file in each one's config.json, and hands
    // each a task; woken again for its children, it publishes.
    let root_agent = scratch.path().join("root.sh");
    std::fs::write(
        &root_agent,
        format!(
            "#!/bin/bash\n\
             [ \"$SMITH_WAKE\" = children ] && {{ echo done > outbox/result.md; exit 0; }}\n\
             mkdir children/smith-001 children/smith-002\n\
             printf '{{\"agent\": {{\"command\": [\"%s\"]}}}}' '{prog}' > children/smith-001/config.json\n\
             printf '{{\"agent\": {{\"command\": [\"/bin/cat\", \"%s\"]}}}}' '{secret}' > children/smith-002/config.json\n\
             echo go > children/smith-001/inbox/task-1.md\n\
             echo go > children/smith-002/inbox/task-1.md\n",
            prog = prog.display(),
            secret = secret.display()
        ),
    )
    .expect("root agent");
    std::fs::set_permissions(
        &root_agent,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let config = serde_json::json!({
        "agent": { "command": [root_agent], "retries": 0 },
    });
    let m = mount_with(&config, mode);
    std::fs::write(m.path().join("smiths/smith-root/inbox/task-1.md"), "go\n").expect("task");
    for child in ["smith-001", "smith-002"] {
        let (log, meta) = ended_run(&m, &format!("smiths/smith-root/children/{child}"), 1, 90);
        assert!(
            !log.contains("HOST-PROGRAM-RAN") && !log.contains("HOST-SECRET-42"),
            "[{mode}] {child} reached a host file its parent named:\n{log}"
        );
        assert!(
            meta["exit_code"] != 0 || !meta["error"].is_null(),
            "[{mode}] {child}'s run succeeded: {meta}\n{log}"
        );
    }
}

#[test]
fn a_smith_cannot_name_host_files_for_its_child_cgroup() {
    a_smith_cannot_name_host_files_for_its_child("cgroup");
}

#[test]
fn a_smith_cannot_name_host_files_for_its_child_ancestry() {
    a_smith_cannot_name_host_files_for_its_child("ancestry");
}
