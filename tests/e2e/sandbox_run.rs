//! The run start in the sandbox (issue 26, docs/SPEC.md §12, §3, §5), on real mounts in both
//! identity modes: a sandboxed run killed by a signal reports the signal (not its init's
//! `128 + N`); the run is a session leader with a session keyring of its own (a key of the
//! daemon's session is not the run's); `smithfs run` from a terminal gives the command a pty
//! of its own (window size, input, Ctrl-C, exit status; `TIOCSTI` cannot reach the operator's
//! terminal); `sandbox.uid_per_smith` runs a whole tree, parent → child task → child result →
//! parent, each smith its own uid, with a sibling's `private/` closed to the others' uids in the
//! store; hooks run as the user who mounted (`SUDO_UID`), out of the runs' reach; a `smithfs run`
//! keeper killed by SIGKILL takes its sandboxed run with it.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::*;

/// A sandboxed mount in identity `mode` with `config` in config.json (`sandbox.uid` pinned to
/// 65534 unless it names one; see [`mount_with_env`] for `SUDO_UID`).
fn mount_with(config: &serde_json::Value, mode: &'static str) -> TestMount {
    mount_with_env(config, mode, Vec::new())
}

/// [`mount_with`], with `env` in `smithfs mount`'s environment too; with `SUDO_UID` in `env`
/// and no `sandbox.uid` in `config`, the agents' user is the `SUDO_UID` user (docs/SPEC.md §12,
/// "Users": nothing is pinned).
fn mount_with_env(
    config: &serde_json::Value,
    mode: &'static str,
    env: Vec<(&'static str, &'static str)>,
) -> TestMount {
    let mut c = config.clone();
    if c["sandbox"]["uid"].is_null() && !env.iter().any(|(k, _)| *k == "SUDO_UID") {
        c["sandbox"]["uid"] = serde_json::json!(65534);
    }
    TestMount::with_config(&c, mode, env)
}

/// A `user` key named `name` in this process's session keyring (the daemon it starts inherits
/// it); `false` when the kernel or a filter refuses keys.
fn add_session_key(name: &str) -> bool {
    let name = std::ffi::CString::new(name).expect("name");
    let payload = b"daemon's secret";
    // SAFETY: add_key with NUL-terminated strings and a buffer of the given length.
    let id = unsafe {
        libc::syscall(
            libc::SYS_add_key,
            c"user".as_ptr(),
            name.as_ptr(),
            payload.as_ptr(),
            payload.len(),
            -3i32, // KEY_SPEC_SESSION_KEYRING
        )
    };
    id > 0
}

/// A run killed by SIGTERM reports `signal: 15` in `meta.json` and `run.exited` (not the
/// init's `exit_code: 143`), a run that exits 143 itself reports `exit_code: 143`; the run is a
/// session leader, and a key of the daemon's session keyring is not visible to it.
fn signals_and_session(mode: &'static str) {
    if !is_root() {
        eprintln!("skipped: the sandbox needs root");
        return;
    }
    let key = format!("smithfs-runx-{}-{mode}", std::process::id());
    let keys = add_session_key(&key);
    let agent = r#"
read -r what < "$SMITH_TASK_FILE"
set -- $(cat /proc/$$/stat)
echo "pid $$ sid $6"
grep -c . /proc/keys | sed 's/^/keys: /'
cat /proc/keys
case "$what" in
  kill) kill -TERM $$; sleep 5 ;;
  *) exit 143 ;;
esac
"#;
    let config = serde_json::json!({
        "agent": { "command": ["/bin/sh", "-c", agent], "retries": 0 },
    });
    let m = mount_with(&config, mode);
    let inbox = m.path().join("smiths/smith-root/inbox");
    std::fs::write(inbox.join("task-1.md"), "kill\n").expect("task 1");
    let (log, meta) = ended_run(&m, "smiths/smith-root", 1, 90);
    assert!(meta["error"].is_null(), "[{mode}] {meta}\n{log}");
    assert_eq!(meta["signal"], 15, "[{mode}] {meta}\n{log}");
    assert!(meta["exit_code"].is_null(), "[{mode}] {meta}");
    assert!(
        log.contains("pid 2 sid 2"),
        "[{mode}] a session leader:\n{log}"
    );
    if keys {
        assert!(
            !log.contains(&key),
            "[{mode}] the daemon's session key is the run's:\n{log}"
        );
    } else {
        eprintln!("[{mode}] keys refused on this host: the keyring part is not checked");
    }
    std::fs::write(inbox.join("task-2.md"), "exit\n").expect("task 2");
    let (log, meta) = ended_run(&m, "smiths/smith-root", 2, 90);
    assert_eq!(meta["exit_code"], 143, "[{mode}] {meta}\n{log}");
    assert!(meta["signal"].is_null(), "[{mode}] {meta}");
    let events = std::fs::read_to_string(m.path().join(".smithfs/events.jsonl")).expect("events");
    let exited: Vec<serde_json::Value> = events
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["event"] == "run.exited")
        .collect();
    assert_eq!(exited.len(), 2, "[{mode}] {events}");
    assert_eq!(exited[0]["signal"], 15, "[{mode}] {}", exited[0]);
    assert_eq!(exited[1]["exit_code"], 143, "[{mode}] {}", exited[1]);
}

#[test]
fn a_signalled_sandboxed_run_reports_its_signal_cgroup() {
    signals_and_session("cgroup");
}

#[test]
fn a_signalled_sandboxed_run_reports_its_signal_ancestry() {
    signals_and_session("ancestry");
}

/// Drives `smithfs run` from a real terminal: a pty made here (window 33×101), `smithfs run`
/// the leader of its session with it as controlling terminal; then `steps` (`(wait for, send,
/// resize)`), and the exit status. Prints the transcript and `STATUS n`.
const DRIVER: &str = r#"
import fcntl, os, select, struct, sys, termios, time
smithfs, mount, inner = sys.argv[1], sys.argv[2], sys.argv[3]
steps = [s.split('|') for s in sys.argv[4:]]
m, s = os.openpty()
fcntl.ioctl(m, termios.TIOCSWINSZ, struct.pack('HHHH', 33, 101, 0, 0))
r = os.fstat(s).st_rdev
print('OUTER', (os.major(r) << 8) | (os.minor(r) & 0xff) | ((os.minor(r) & ~0xff) << 12), flush=True)
pid = os.fork()
if pid == 0:
    os.setsid()
    fcntl.ioctl(s, termios.TIOCSCTTY, 0)
    for fd in (0, 1, 2):
        os.dup2(s, fd)
    os.execv(smithfs, [smithfs, 'run', '--mount', mount, '--smith', 'smith-root', '--',
                       '/bin/bash', '-c', inner])
out = b''
def until(tok, secs=60):
    global out
    end = time.time() + secs
    while tok.encode() not in out:
        left = end - time.time()
        if left <= 0:
            sys.stdout.write(out.decode(errors='replace'))
            print('\nTIMEOUT waiting for', tok, flush=True)
            os.kill(pid, 9)
            sys.exit(3)
        r, _, _ = select.select([m], [], [], left)
        if r:
            try:
                chunk = os.read(m, 4096)
            except OSError:
                chunk = b''
            if not chunk:
                break
            out += chunk
for wait, send, size in steps:
    until(wait)
    if size:
        rows, cols = size.split('x')
        fcntl.ioctl(m, termios.TIOCSWINSZ, struct.pack('HHHH', int(rows), int(cols), 0, 0))
    if send:
        os.write(m, send.encode().decode('unicode_escape').encode('latin-1'))
_, status = os.waitpid(pid, 0)
end = time.time() + 2
while time.time() < end:
    r, _, _ = select.select([m], [], [], 0.1)
    if not r:
        break
    try:
        chunk = os.read(m, 4096)
    except OSError:
        break
    if not chunk:
        break
    out += chunk
sys.stdout.write(out.decode(errors='replace'))
print('\nSTATUS', os.waitstatus_to_exitcode(status), flush=True)
"#;

fn drive(m: &TestMount, inner: &str, steps: &[&str]) -> String {
    let out = run(Command::new("python3")
        .arg("-c")
        .arg(DRIVER)
        .arg(SMITHFS)
        .arg(m.path())
        .arg(inner)
        .args(steps));
    format!("{}\n{}", out.stdout, out.stderr)
}

/// The status line of a transcript.
fn status_of(text: &str) -> Option<i32> {
    text.lines()
        .find_map(|l| l.strip_prefix("STATUS "))
        .and_then(|s| s.trim().parse().ok())
}

/// `smithfs run` from a terminal (docs/SPEC.md §12): the command's stdin, stdout and stderr are
/// a pty of its own (not the operator's), it leads its session with that pty as controlling
/// terminal, gets the window size and its changes, the operator's input, Ctrl-C as SIGINT, and
/// `smithfs run` exits with its status (a command killed by SIGINT: 130); `TIOCSTI` on its
/// terminal and `/dev/tty` is refused and nothing reaches the operator's terminal.
fn run_in_a_terminal(mode: &'static str) {
    if !is_root() {
        eprintln!("skipped: the sandbox needs root");
        return;
    }
    if !Command::new("python3")
        .arg("-c")
        .arg("import pty")
        .status()
        .is_ok_and(|s| s.success())
    {
        eprintln!("skipped: no python3 to drive a terminal");
        return;
    }
    let m = mount_with(&serde_json::json!({}), mode);
    let inner = r#"
trap 'echo "winch $(stty size)"' WINCH
trap 'echo got-int; exit 7' INT
set -- $(cat /proc/$$/stat)
echo "inner $7 pid $$ sid $6 tpgid $8 pgrp $5 size $(stty size)"
for t in /dev/stdin /dev/tty; do
  perl -e 'open(T, "+<", $ARGV[0]) or die "open: $!\n";
           my $c = "Z"; print ioctl(T, 0x5412, $c) ? "tiocsti $ARGV[0]: done\n" : "tiocsti $ARGV[0]: refused\n"' $t
done
echo ready
while :; do if read -r -t 0.2 l; then echo "line: $l"; fi; done
"#;
    let text = drive(
        &m,
        inner,
        &[
            "ready||40x120",
            "winch 40 120|hello\\r|",
            "line: hello|\\x03|",
        ],
    );
    let outer = text
        .lines()
        .find_map(|l| l.strip_prefix("OUTER "))
        .unwrap_or_else(|| panic!("[{mode}] no outer tty:\n{text}"))
        .trim()
        .to_string();
    let inner_line = text
        .lines()
        .find(|l| l.starts_with("inner "))
        .unwrap_or_else(|| panic!("[{mode}] the command did not run:\n{text}"));
    let f: Vec<&str> = inner_line.split_whitespace().collect();
    // inner TTY_NR pid P sid S tpgid G pgrp PG size R C (/proc/PID/stat's controlling
    // terminal: the view's /dev/pts is another instance, so the pty has no name in it).
    assert_eq!(f.len(), 13, "[{mode}] {inner_line}");
    assert_ne!(f[1], "0", "[{mode}] no controlling terminal: {inner_line}");
    assert_ne!(
        f[1], outer,
        "[{mode}] the operator's terminal: {inner_line}"
    );
    assert_eq!(f[3], f[5], "[{mode}] not a session leader: {inner_line}");
    assert_eq!(
        f[7], f[9],
        "[{mode}] not the foreground group: {inner_line}"
    );
    assert_eq!(&f[11..13], ["33", "101"], "[{mode}] {inner_line}");
    assert!(
        text.contains("tiocsti /dev/stdin: refused") && text.contains("tiocsti /dev/tty: refused"),
        "[{mode}]\n{text}"
    );
    assert!(!text.contains(": done"), "[{mode}]\n{text}");
    assert!(text.contains("winch 40 120"), "[{mode}]\n{text}");
    assert!(text.contains("got-int"), "[{mode}]\n{text}");
    assert_eq!(status_of(&text), Some(7), "[{mode}]\n{text}");

    // Killed by the SIGINT of Ctrl-C: 130, as a shell reports it.
    let text = drive(&m, "echo ready; exec sleep 60", &["ready|\\x03|"]);
    assert_eq!(status_of(&text), Some(130), "[{mode}]\n{text}");

    // Pipes are unchanged: no pty.
    let out = run(Command::new(SMITHFS)
        .args(["run", "--mount"])
        .arg(m.path())
        .args([
            "--smith",
            "smith-root",
            "--",
            "/bin/sh",
            "-c",
            "tty; exit 3",
        ]));
    assert_eq!(out.code, Some(3), "[{mode}] {out:?}");
    assert!(out.stdout.contains("not a tty"), "[{mode}] {out:?}");
}

#[test]
fn smithfs_run_in_a_terminal_has_a_pty_of_its_own_cgroup() {
    run_in_a_terminal("cgroup");
}

#[test]
fn smithfs_run_in_a_terminal_has_a_pty_of_its_own_ancestry() {
    run_in_a_terminal("ancestry");
}

/// A whole tree with `sandbox.uid_per_smith` (docs/SPEC.md §12, §3): the root (its uid) makes
/// two children and writes each a task in its `inbox/` (the child's uid, 0755 in the store);
/// each child (its own uid) writes a secret in `private/` and a result; the root, woken by its
/// children, merges their results. Every create is its caller's in the store; a child's
/// `private/` is 0700 there, so the sibling's uid cannot read it even in the store.
fn uid_per_smith_tree(mode: &'static str) {
    if !is_root() {
        eprintln!("skipped: the sandbox needs root");
        return;
    }
    let agent = r#"
cd "$SMITH_DIR" || exit 1
if [ "$SMITH_LEVEL" = 0 ]; then
  if [ "$SMITH_WAKE" = task ]; then
    for c in smith-001 smith-002; do
      mkdir children/$c || exit 2
      echo "work of $c" > children/$c/inbox/task-1.md || exit 3
    done
    exit 0
  fi
  { echo "root $(id -u)"; cat children/*/outbox/result.md; } > outbox/final.tmp && mv outbox/final.tmp outbox/result.md
  exit 0
fi
echo "secret of $SMITH_ID" > private/secret.txt || exit 4
echo "$SMITH_ID $(id -u) did: $(cat "$SMITH_TASK_FILE")" > private/result.md && mv private/result.md outbox/result.md
"#;
    let config = serde_json::json!({
        "agent": { "command": ["/bin/sh", "-c", agent], "retries": 0 },
        "sandbox": { "uid_per_smith": true },
    });
    let mut m = mount_with(&config, mode);
    let root = m.path().join("smiths/smith-root");
    std::fs::write(root.join("inbox/task-1.md"), "split\n").expect("task");
    let result = poll_until(120, "the root's final result", || {
        let t = std::fs::read_to_string(root.join("outbox/result.md")).ok()?;
        t.starts_with("root ").then_some(t)
    });
    let uid_of = |line_start: &str| -> u32 {
        result
            .lines()
            .find_map(|l| {
                let rest = l.strip_prefix(line_start)?;
                rest.split_whitespace().next()?.parse().ok()
            })
            .unwrap_or_else(|| panic!("[{mode}] no {line_start}in:\n{result}"))
    };
    let (r, a, b) = (uid_of("root "), uid_of("smith-001 "), uid_of("smith-002 "));
    assert!(
        r != a && a != b && r != b && r != 0 && a != 0 && b != 0,
        "[{mode}] one uid per smith: {r} {a} {b}\n{result}"
    );
    assert!(
        result.contains("smith-001 ") && result.contains("did: work of smith-001"),
        "[{mode}]\n{result}"
    );
    use std::os::unix::fs::MetadataExt;
    let child = |c: &str| root.join("children").join(c);
    let task = std::fs::metadata(child("smith-001").join("inbox/task-1.md")).expect("task");
    assert_eq!(task.uid(), r, "[{mode}] the parent's task is the parent's");
    let secret = std::fs::metadata(child("smith-001").join("private/secret.txt")).expect("secret");
    assert_eq!(secret.uid(), a, "[{mode}] the child's file is the child's");
    m.umount();
    // In the store: the sibling's uid cannot read smith-001's private/, smith-001's can.
    let store_secret = child("smith-001").join("private/secret.txt");
    let private = std::fs::metadata(child("smith-001").join("private")).expect("private");
    assert_eq!(private.mode() & 0o777, 0o700, "[{mode}]");
    assert_eq!(private.uid(), a, "[{mode}]");
    let as_uid = |uid: u32| {
        run(Command::new("setpriv")
            .arg(format!("--reuid={uid}"))
            .arg(format!("--regid={uid}"))
            .arg("--clear-groups")
            .arg("cat")
            .arg(&store_secret))
    };
    let sibling = as_uid(b);
    assert!(
        !sibling.ok() && sibling.stderr.contains("Permission denied"),
        "[{mode}] the sibling's uid read it: {sibling:?}"
    );
    let own = as_uid(a);
    assert!(
        own.stdout.contains("secret of smith-001"),
        "[{mode}] {own:?}"
    );
}

#[test]
fn uid_per_smith_runs_a_whole_tree_cgroup() {
    uid_per_smith_tree("cgroup");
}

#[test]
fn uid_per_smith_runs_a_whole_tree_ancestry() {
    uid_per_smith_tree("ancestry");
}

/// uid and gid of the unprivileged `smithfs-test` user, created if missing, under the lock
/// the tests of `/dev/fuse` hold for it.
fn test_user() -> (u32, u32) {
    let _lock = DevFuseLock::acquire();
    common::user::test_user()
}

/// Hooks as the mounting user (docs/SPEC.md §12, notes XT20): a root daemon mounted with
/// `SUDO_UID`/`SUDO_GID` of the unprivileged `smithfs-test` runs a hook as that uid and gid with
/// no capability and its account's `USER`; a run that tries to rewrite the hook's program (root's,
/// 0755, beside the tree) and to make a file beside it fails, the program is unchanged, and the
/// hook runs the operator's program. With `pinned` false the agents' user is the `SUDO_UID` user
/// (the default), so the hook is the Operator through the mount and reads the smith's result;
/// with `pinned` (`sandbox.uid` 65534, another uid) the hook's uid is none of §12's three
/// Operator uids, so through the mount it is Unknown and cannot read the result.
fn hooks_as_the_mounting_user(mode: &'static str, pinned: bool) {
    if !is_root() {
        eprintln!("skipped: needs root to mount with SUDO_UID and switch the hook's user");
        return;
    }
    let (uid, gid) = test_user();
    let sudo_uid: &'static str = Box::leak(uid.to_string().into_boxed_str());
    let sudo_gid: &'static str = Box::leak(gid.to_string().into_boxed_str());
    let mut m = mount_with_env(
        &serde_json::json!({}),
        mode,
        vec![("SUDO_UID", sudo_uid), ("SUDO_GID", sudo_gid)],
    );
    let scratch = m.path().parent().expect("scratch").to_path_buf();
    let hook_dir = scratch.join("hooks");
    std::fs::create_dir(&hook_dir).expect("hook dir");
    let program = hook_dir.join("hook.sh");
    let script = "#!/bin/sh\nset -u\nout=\"$1\"\n\
        { echo \"uid $(id -u) gid $(id -g) user $USER\"; grep ^CapEff /proc/self/status;\n\
          echo \"result: $(cat \"$2/smiths/smith-root/outbox/result.md\")\"; } > \"$out/seen.tmp\" 2>&1\n\
        mv \"$out/seen.tmp\" \"$out/seen\"\n";
    std::fs::write(&program, script).expect("hook program");
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    // Where the hook (the mounting user) writes what it saw.
    let out = scratch.join("hook-out");
    std::fs::create_dir(&out).expect("out dir");
    std::os::unix::fs::chown(&out, Some(uid), Some(gid)).expect("chown out dir");
    let agent = format!(
        "cd \"$SMITH_DIR\" || exit 1\n\
         if echo evil > '{p}' 2>/dev/null; then w=written; else w=refused; fi\n\
         if echo evil > '{d}/planted' 2>/dev/null; then n=written; else n=refused; fi\n\
         echo \"rewrite $w plant $n\" > private/r.md && mv private/r.md outbox/result.md\n",
        p = program.display(),
        d = hook_dir.display()
    );
    let mut config = serde_json::json!({
        "agent": { "command": ["/bin/sh", "-c", agent], "retries": 0 },
        "hooks": { "result.published": [[
            program.to_str().expect("utf-8"), out.to_str().expect("utf-8"),
            m.path().to_str().expect("utf-8"),
        ]] },
    });
    if pinned {
        config["sandbox"] = serde_json::json!({ "uid": 65534 });
    }
    m.umount();
    std::fs::write(m.path().join("config.json"), config.to_string()).expect("config.json");
    m.mount();
    std::fs::write(m.path().join("smiths/smith-root/inbox/task-1.md"), "go\n").expect("task");
    let seen = poll_until(90, "the hook's report", || {
        std::fs::read_to_string(out.join("seen")).ok()
    });
    let events =
        std::fs::read_to_string(m.path().join(".smithfs/events.jsonl")).unwrap_or_default();
    let result = std::fs::read_to_string(m.path().join("smiths/smith-root/outbox/result.md"))
        .expect("the smith's result, read by root");
    assert_eq!(
        result, "rewrite refused plant refused\n",
        "[{mode}] the run wrote beside the hook"
    );
    assert!(
        seen.contains(&format!("uid {uid} gid {gid} user smithfs-test")),
        "[{mode}] {seen}\n{events}"
    );
    assert!(
        seen.contains("CapEff:\t0000000000000000"),
        "[{mode}] the hook kept capabilities: {seen}"
    );
    if pinned {
        assert!(
            seen.contains("result: \n") && !seen.contains("rewrite"),
            "[{mode}] a hook of a uid outside the Operator's read the mount: {seen}"
        );
    } else {
        assert!(
            seen.contains("result: rewrite refused plant refused"),
            "[{mode}] the hook could not read the mount as the Operator: {seen}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(&program).expect("program"),
        script,
        "[{mode}] the hook's program changed"
    );
    assert!(!hook_dir.join("planted").exists(), "[{mode}]");
}

#[test]
fn hooks_run_as_the_mounting_user_cgroup() {
    hooks_as_the_mounting_user("cgroup", false);
}

#[test]
fn hooks_run_as_the_mounting_user_ancestry() {
    hooks_as_the_mounting_user("ancestry", false);
}

#[test]
fn hooks_of_a_mounting_user_who_is_not_the_agents_are_unknown_cgroup() {
    hooks_as_the_mounting_user("cgroup", true);
}

/// A `smithfs run --smith` keeper killed by SIGKILL takes its sandboxed run with it (the init's
/// `PR_SET_PDEATHSIG`, as the scheduler's runs die with their daemon): no init, no command is
/// left holding the mount, and the mount unmounts.
#[test]
fn a_killed_keeper_takes_its_sandboxed_run() {
    if !is_root() {
        eprintln!("skipped: the sandbox needs root");
        return;
    }
    let mut m = mount_with(&serde_json::json!({}), "cgroup");
    let mut keeper = Command::new(SMITHFS)
        .args(["run", "--mount"])
        .arg(m.path())
        .args(["--smith", "smith-root", "--", "sleep", "300"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn smithfs run");
    let keeper_pid = keeper.id().to_string();
    // The init: the keeper's child, as /proc says (its parent field).
    let child_of = |ppid: &str| -> Option<i32> {
        std::fs::read_dir("/proc").ok()?.find_map(|e| {
            let e = e.ok()?;
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let after = stat.rsplit_once(')')?.1;
            (after.split_whitespace().nth(1)? == ppid).then_some(pid)
        })
    };
    let init = poll_until(30, "the sandbox's init", || child_of(&keeper_pid));
    // Should the test fail, the run still ends: SIGKILL of its init ends its pid namespace.
    struct EndRun(i32);
    impl Drop for EndRun {
        fn drop(&mut self) {
            let cmdline = std::fs::read(format!("/proc/{}/cmdline", self.0)).unwrap_or_default();
            let still_it = String::from_utf8_lossy(&cmdline).contains("__sandbox-init");
            if std::thread::panicking() && still_it {
                // SAFETY: a signal to the run's init, which this test found and which is still
                // there.
                unsafe { libc::kill(self.0, libc::SIGKILL) };
            }
        }
    }
    let _end = EndRun(init);
    let sleep = poll_until(30, "the command", || child_of(&init.to_string()));
    keeper.kill().expect("SIGKILL the keeper");
    let _ = keeper.wait();
    let gone = |pid: i32| !Path::new(&format!("/proc/{pid}")).exists();
    poll_until(30, "the init and its command to end", || {
        (gone(init) && gone(sleep)).then_some(())
    });
    m.umount();
}
