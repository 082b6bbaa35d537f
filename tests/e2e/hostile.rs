//! What a hostile smith does to the daemon stays its own problem (found by a hostile-agent review,
//! 2026-12-05):
//! - a smith's `config.json` that is not a small regular file fails that smith's run with the
//!   reason, never the scheduler (docs/SPEC.md §8 "a bad one fails that smith's run", notes
//!   XT22): a parent makes one child's config.json a FIFO (which would block a reader until
//!   someone writes it) and another's a sparse file of 1 GiB (no quota paid, a gigabyte of the
//!   daemon's memory if read); both runs fail at once, naming the file, and the parent's next
//!   task still runs;
//! - ioctls on the mount, any number, do not grow the daemon's log (notes H15).

use crate::common;

use common::launcher::Launcher;
use common::*;

const AGENT: &str = r#"
cd "$SMITH_DIR"
read -r what < "$SMITH_TASK_FILE"
case "$what" in
  parent)
    mkdir children/smith-001 children/smith-002
    rm children/smith-001/config.json
    mkfifo children/smith-001/config.json
    truncate -s 1G children/smith-002/config.json
    echo work > children/smith-001/inbox/task-1.md
    echo work > children/smith-002/inbox/task-1.md
    ;;
  again) echo "the scheduler still runs" ;;
esac
"#;

fn a_hostile_config(mode: &'static str, launcher: Launcher) {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let config = serde_json::json!({
        "agent": { "command": ["/bin/bash", "-c", AGENT], "retries": 0 },
    });
    let m = launcher.mount(&config, mode);
    let mode = format!("{mode}, {}", launcher.kind());
    let inbox = m.path().join("smiths/smith-root/inbox");
    std::fs::write(inbox.join("task-1.md"), "parent\n").expect("task");
    let (log, meta) = ended_run(&m, "smiths/smith-root", 1, 60);
    assert_eq!(meta["exit_code"], 0, "[{mode}] parent: {meta}\n{log}");
    let children = "smiths/smith-root/children";
    for (child, why) in [
        ("smith-001", "config.json is not a regular file"),
        ("smith-002", "config.json is larger than"),
    ] {
        let (log, meta) = ended_run(&m, &format!("{children}/{child}"), 1, 60);
        let error = meta["error"].as_str().unwrap_or_default();
        assert!(error.contains(why), "[{mode}] {child}: {meta}\n{log}");
    }
    std::fs::write(inbox.join("task-2.md"), "again\n").expect("task 2");
    let (log, meta) = ended_run(&m, "smiths/smith-root", 2, 60);
    assert_eq!(meta["exit_code"], 0, "[{mode}] {meta}\n{log}");
}

#[test]
fn a_fifo_or_a_huge_config_fails_only_its_smiths_run_cgroup() {
    a_hostile_config("cgroup", Launcher::Local);
}

#[test]
fn a_fifo_or_a_huge_config_fails_only_its_smiths_run_ancestry() {
    a_hostile_config("ancestry", Launcher::Local);
}

#[test]
fn a_fifo_or_a_huge_config_fails_only_its_smiths_run_loopback_cgroup() {
    a_hostile_config("cgroup", Launcher::Loopback);
}

#[test]
fn a_fifo_or_a_huge_config_fails_only_its_smiths_run_loopback_ancestry() {
    a_hostile_config("ancestry", Launcher::Loopback);
}

/// 5 000 ioctls of a sandboxed smith on a file of the mount are ENOTTY and add nothing to the
/// daemon's log (the fuser adapter's default handler, before our own loop, logged a warning for each);
/// also from a loopback run, whose node kernel forwards them through `attach`.
fn ioctls_stay_quiet(launcher: Launcher) {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let m = launcher.mount(&serde_json::json!({}), "cgroup");
    let log = m.path().join(".smithfs/daemon.log");
    let before = std::fs::metadata(&log).map(|md| md.len()).unwrap_or(0);
    let script = r#"
import fcntl, os
f = os.open(os.environ["SMITH_DIR"] + "/smith.md", os.O_RDONLY)
codes = set()
for i in range(5000):
    try:
        fcntl.ioctl(f, 0x1234 + i % 7)
    except OSError as e:
        codes.add(e.errno)
print("errnos", sorted(codes))
"#;
    let out = launcher
        .run_as(&m, m.path(), "smith-root", &["python3", "-c", script])
        .expect_ok("ioctls");
    let kind = launcher.kind();
    assert_eq!(
        out.trim(),
        format!("errnos [{}]", libc::ENOTTY),
        "[{kind}] {out}"
    );
    let after = std::fs::metadata(&log).map(|md| md.len()).unwrap_or(0);
    assert!(
        after.saturating_sub(before) < 4096,
        "[{kind}] the daemon's log grew by {} bytes",
        after - before
    );
}

#[test]
fn ioctls_do_not_grow_the_daemons_log() {
    ioctls_stay_quiet(Launcher::Local);
}

#[test]
fn ioctls_do_not_grow_the_daemons_log_loopback() {
    ioctls_stay_quiet(Launcher::Loopback);
}

/// Connections to the remote mount's listener that never prove a run — closed at once, or after
/// bytes that are not TLS — need no ticket, so anyone who reaches the port makes them at will:
/// 3 000 of them add at most a summary line per 10 s to the daemon's log (one line each added
/// 56 MiB in 15 s from a sandboxed agent; notes H25).
#[test]
fn connections_without_a_ticket_do_not_grow_the_daemons_log() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let m = Launcher::Loopback.mount(&serde_json::json!({}), "cgroup");
    let log = m.path().join(".smithfs/daemon.log");
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let addr = text
        .lines()
        .find(|l| l.contains("remote mount listener"))
        .and_then(|l| l.split("addr=").nth(1))
        .and_then(|a| a.split_whitespace().next())
        .unwrap_or_else(|| panic!("no listener address in the daemon's log: {text}"))
        .to_string();
    let before = std::fs::metadata(&log).map(|md| md.len()).unwrap_or(0);
    for i in 0..3000 {
        if let Ok(mut c) = std::net::TcpStream::connect(&addr) {
            if i % 3 == 0 {
                let _ = std::io::Write::write_all(&mut c, b"GET / HTTP/1.0\r\n\r\n");
            }
        }
    }
    // What a flood logs comes within moments; watch the log for 2 s.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while std::time::Instant::now() < deadline {
        let grown = std::fs::metadata(&log)
            .map(|md| md.len())
            .unwrap_or(0)
            .saturating_sub(before);
        assert!(grown < 4096, "the daemon's log grew by {grown} bytes");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Opens the FIFO `argv[1]` for writing without blocking and connects to the socket `argv[2]`:
/// prints what each gave (`ENXIO`: the FIFO was reached, no reader; `ECONNREFUSED`: the socket
/// was reached, no listener; `EACCES`: refused).
const PROBE: &str = r#"
import errno, os, socket, sys
def fifo(p):
    try:
        os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK))
        return "opened"
    except OSError as e:
        return errno.errorcode[e.errno]
def sock(p):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(p)
        return "connected"
    except OSError as e:
        return errno.errorcode[e.errno]
print(fifo(sys.argv[1]), sock(sys.argv[2]))
"#;

/// A FIFO and a unix socket in a smith's `private/` and `home/` are its own (docs/SPEC.md §3:
/// other smiths have no right there, notes XT23): its parent and its child cannot open the FIFO
/// or connect to the socket (EACCES), though both share its uid and neither reaches the daemon
/// once the path is walked; the smith itself still can, before and after their attempts.
pub(crate) fn rendezvous_of_another_smith(mode: &'static str, launcher: Launcher) {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let m = launcher.mount(&serde_json::json!({}), mode);
    let mode = format!("{mode}, {}", launcher.kind());
    let root = m.path().join("smiths/smith-root");
    launcher
        .run_as(
            &m,
            m.path(),
            "smith-root",
            &["mkdir", "smiths/smith-root/children/smith-001"],
        )
        .expect_ok("mkdir smith-001");
    let make = |who: &str, dir: &std::path::Path| {
        let script = format!(
            "mkfifo {d}/private/fifo && python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind(\"{d}/home/sock\")'",
            d = dir.display()
        );
        launcher
            .run_as(&m, m.path(), who, &["sh", "-c", &script])
            .expect_ok("mkfifo and bind");
    };
    let probe = |who: &str, dir: &std::path::Path| -> String {
        let (fifo, sock) = (dir.join("private/fifo"), dir.join("home/sock"));
        let out = launcher.run_as(
            &m,
            m.path(),
            who,
            &[
                "python3",
                "-c",
                PROBE,
                &fifo.to_string_lossy(),
                &sock.to_string_lossy(),
            ],
        );
        out.expect_ok("probe").trim().to_string()
    };
    let child_dir = root.join("children/smith-001");
    make("smith-root", &root);
    make("smith-root/smith-001", &child_dir);
    let reached = "ENXIO ECONNREFUSED";
    assert_eq!(probe("smith-root", &root), reached, "[{mode}] its own");
    assert_eq!(
        probe("smith-root/smith-001", &child_dir),
        reached,
        "[{mode}] its own"
    );
    assert_eq!(
        probe("smith-root/smith-001", &root),
        "EACCES EACCES",
        "[{mode}] the child reached its parent's FIFO or socket"
    );
    assert_eq!(
        probe("smith-root", &child_dir),
        "EACCES EACCES",
        "[{mode}] the parent reached its child's FIFO or socket"
    );
    assert_eq!(
        probe("smith-root", &root),
        reached,
        "[{mode}] its own, after"
    );
    assert_eq!(
        probe("smith-root/smith-001", &child_dir),
        reached,
        "[{mode}] its own, after"
    );
}

#[test]
fn a_fifo_or_socket_of_another_smith_is_out_of_reach_cgroup() {
    rendezvous_of_another_smith("cgroup", Launcher::Local);
}

#[test]
fn a_fifo_or_socket_of_another_smith_is_out_of_reach_loopback_cgroup() {
    rendezvous_of_another_smith("cgroup", Launcher::Loopback);
}

#[test]
fn a_fifo_or_socket_of_another_smith_is_out_of_reach_ancestry() {
    rendezvous_of_another_smith("ancestry", Launcher::Local);
}

#[test]
fn a_fifo_or_socket_of_another_smith_is_out_of_reach_loopback_ancestry() {
    rendezvous_of_another_smith("ancestry", Launcher::Loopback);
}

/// A smith cannot give its file away or make it set-user-ID root (notes XT24): with
/// `sandbox.uid_per_smith` the mount has no `default_permissions`, and chown/chmod were made by
/// the daemon as root with only the §3 rules checked — an agent chowned a copy of `/bin/sh` to
/// 0:0 and made it 6755, a set-user-ID root shell in the store for any local user after
/// umount. Now, in both identity modes, with and without a uid per smith: chown and chgrp to
/// root are EPERM, the file stays the smith's, a mode change of its own file still works.
pub(crate) fn no_file_given_away(mode: &'static str, launcher: Launcher) {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    const TRY: &str = "cp /bin/true private/t; \
        chown 0:0 private/t 2>/dev/null && echo chown-ok || echo chown-refused; \
        chgrp 0 private/t 2>/dev/null && echo chgrp-ok || echo chgrp-refused; \
        chmod 4755 private/t && echo chmod-ok; \
        [ \"$(stat -c %u private/t)\" = \"$(id -u)\" ] && echo still-mine";
    for per_smith in [false, true] {
        let config = serde_json::json!({"sandbox": {"uid_per_smith": per_smith}});
        let m = launcher.mount(&config, mode);
        let out = launcher.run_as(
            &m,
            &m.path().join("smiths/smith-root"),
            "smith-root",
            &["sh", "-c", TRY],
        );
        let out = out.expect_ok("the attempts");
        assert_eq!(
            out.split_whitespace().collect::<Vec<_>>(),
            ["chown-refused", "chgrp-refused", "chmod-ok", "still-mine"],
            "[{mode}, {}] uid_per_smith {per_smith}",
            launcher.kind()
        );
    }
}

#[test]
fn a_smith_cannot_give_its_file_to_root_cgroup() {
    no_file_given_away("cgroup", Launcher::Local);
}

#[test]
fn a_smith_cannot_give_its_file_to_root_loopback_cgroup() {
    no_file_given_away("cgroup", Launcher::Loopback);
}

#[test]
fn a_smith_cannot_give_its_file_to_root_ancestry() {
    no_file_given_away("ancestry", Launcher::Local);
}

#[test]
fn a_smith_cannot_give_its_file_to_root_loopback_ancestry() {
    no_file_given_away("ancestry", Launcher::Loopback);
}

/// A run shares no SysV IPC with the host or another run (notes XT25): a sandboxed smith's
/// shared memory segment (a fixed key) is made in an IPC namespace of its own — not the test's,
/// and gone from the host once the run ends; two smiths of one tree do not see each other's.
fn no_ipc_shared(mode: &'static str, launcher: Launcher) {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    const MAKE: &str = r#"use IPC::SysV qw(IPC_CREAT); my $id = shmget(0x5a1f5a1f, 4096, IPC_CREAT|0666) // die "shmget: $!"; shmwrite($id, "secret", 0, 6) or die; print readlink("/proc/self/ns/ipc"), "\n""#;
    const PEEK: &str = r#"use IPC::SysV; my $id = shmget(0x5a1f5a1f, 4096, 0); print defined $id ? "seen" : "unseen", "\n""#;
    let m = launcher.mount(&serde_json::json!({}), mode);
    let mode = format!("{mode}, {}", launcher.kind());
    launcher
        .run_as(
            &m,
            m.path(),
            "smith-root",
            &["mkdir", "smiths/smith-root/children/smith-001"],
        )
        .expect_ok("mkdir smith-001");
    let ns = launcher
        .run_as(&m, m.path(), "smith-root", &["perl", "-e", MAKE])
        .expect_ok("shmget");
    let host = std::fs::read_link("/proc/self/ns/ipc").expect("our ipc namespace");
    assert_ne!(
        ns.trim(),
        host.to_string_lossy(),
        "[{mode}] the run is in the host's IPC namespace"
    );
    let listed = std::process::Command::new("ipcs")
        .args(["-m"])
        .output()
        .expect("ipcs");
    let listed = String::from_utf8_lossy(&listed.stdout).to_lowercase();
    assert!(
        !listed.contains("0x5a1f5a1f"),
        "[{mode}] the run's segment is on the host:\n{listed}"
    );
    let peek = launcher
        .run_as(&m, m.path(), "smith-root/smith-001", &["perl", "-e", PEEK])
        .expect_ok("peek");
    assert_eq!(
        peek.trim(),
        "unseen",
        "[{mode}] another smith's run saw the segment"
    );
}

#[test]
fn runs_share_no_ipc_with_the_host_cgroup() {
    no_ipc_shared("cgroup", Launcher::Local);
}

#[test]
fn runs_share_no_ipc_with_the_host_loopback_cgroup() {
    no_ipc_shared("cgroup", Launcher::Loopback);
}

#[test]
fn runs_share_no_ipc_with_the_host_ancestry() {
    no_ipc_shared("ancestry", Launcher::Local);
}

#[test]
fn runs_share_no_ipc_with_the_host_loopback_ancestry() {
    no_ipc_shared("ancestry", Launcher::Loopback);
}

/// The root's result never stalls the scheduler (notes H20): the root writes a large result
/// once, then opens and closes it many times, appending a byte each time — every close is a
/// completion, `result.published`, and a new `results/final.md` to make. The copy is made off
/// the scheduler thread and coalesced, so a sibling's task given meanwhile runs at once (it
/// waited tens of seconds when the scheduler compared and copied the result per completion),
/// and `final.md` ends up the newest result.
fn root_result_stalls_nothing(mode: &'static str, launcher: Launcher) {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    const BIG: &str = r#"chdir "smiths/smith-root" or die; mkdir "children/smith-001" or die; open(my $h, ">", "outbox/result.md") or die; my $b = "r" x (1 << 20); print $h $b for 1..256; close $h or die"#;
    const LOOP: &str = r#"chdir "smiths/smith-root" or die; for (1..200) { open(my $h, ">>", "outbox/result.md") or die $!; print $h "x"; close $h or die }"#;
    const SIBLING: &str = "echo done > \"$SMITH_DIR/outbox/result.md\"";
    // Through loopback the root's attempts are tasks of the dispatching agent (its config's
    // default), and so is the sibling's.
    let config = match launcher {
        Launcher::Local => serde_json::json!({
            "agent": { "command": ["/bin/sh", "-c", format!("[ \"$SMITH_FULL_ID\" = smith-root ] || {SIBLING}")], "retries": 0 },
        }),
        Launcher::Loopback | Launcher::Slurm(_) => serde_json::json!({}),
    };
    let m = launcher.mount(&config, mode);
    let mode = format!("{mode}, {}", launcher.kind());
    let result = m.path().join("smiths/smith-root/outbox/result.md");
    let fin = m.path().join("results/final.md");
    launcher
        .run_as(&m, m.path(), "smith-root", &["perl", "-e", BIG])
        .expect_ok("the big result");
    poll_until(60, "the first final.md", || {
        std::fs::metadata(&fin).is_ok_and(|md| md.len() == 256 << 20)
    });
    launcher
        .run_as(&m, m.path(), "smith-root", &["perl", "-e", LOOP])
        .expect_ok("the completions");
    let sibling = m.path().join("smiths/smith-root/children/smith-001");
    let task = match launcher {
        Launcher::Local => "t\n".to_owned(),
        Launcher::Loopback | Launcher::Slurm(_) => {
            common::launcher::dispatched(&sibling, &["sh", "-c", SIBLING])
        }
    };
    let started = std::time::Instant::now();
    std::fs::write(sibling.join("inbox/task-v.md"), task).expect("the sibling's task");
    let (log, meta) = ended_run(&m, "smiths/smith-root/children/smith-001", 1, 120);
    let took = started.elapsed();
    assert_eq!(meta["exit_code"], 0, "[{mode}] {meta}\n{log}");
    assert!(
        took < std::time::Duration::from_secs(5),
        "[{mode}] the sibling's task waited {took:?} behind the root's completions"
    );
    let want = std::fs::metadata(&result).expect("result").len();
    assert_eq!(want, (256 << 20) + 200);
    poll_until(120, "final.md to be the newest result", || {
        std::fs::metadata(&fin).is_ok_and(|md| md.len() == want)
    });
}

#[test]
fn the_roots_completions_do_not_stall_the_scheduler_cgroup() {
    root_result_stalls_nothing("cgroup", Launcher::Local);
}

#[test]
fn the_roots_completions_do_not_stall_the_scheduler_loopback_cgroup() {
    root_result_stalls_nothing("cgroup", Launcher::Loopback);
}

#[test]
fn the_roots_completions_do_not_stall_the_scheduler_ancestry() {
    root_result_stalls_nothing("ancestry", Launcher::Local);
}

#[test]
fn the_roots_completions_do_not_stall_the_scheduler_loopback_ancestry() {
    root_result_stalls_nothing("ancestry", Launcher::Loopback);
}

const MONOPOLY: &str = r#"
cd "$SMITH_DIR"
hang='{"agent": {"command": ["/bin/sh", "-c", "trap \"\" TERM; while :; do sleep 1; done"], "timeout_secs": 315360000, "kill_grace_secs": 315360000}}'
case "$SMITH_FULL_ID" in
  smith-root)
    mkdir children/smith-001 children/smith-002
    printf '%s' "$hang" > children/smith-002/config.json
    echo t > children/smith-002/inbox/task-1.md
    echo t > children/smith-001/inbox/task-1.md ;;
  smith-root/smith-001)
    mkdir children/smith-001
    echo t > children/smith-001/inbox/task-1.md
    echo done > outbox/result.md ;;
  smith-root/smith-001/smith-001) exec sleep 1000 ;;
esac
"#;

/// A parent cannot keep the operator from taking its subtree's slots back, and a cancel sticks
/// (notes H21): a child's `config.json` with a ten-year `timeout_secs` (its parent's to give,
/// docs/SPEC.md §8) and `kill_grace_secs` and an agent that ignores TERM is cancelled by the
/// operator and KILLed after the mount-wide grace (1 s), not ten years — `cancel` returns although
/// the parent, woken by the settling, gives the child its task again at once; and `cancel
/// smith-root/smith-001` — done, its own child running — leaves it `cancelled`, so the
/// grandchild's settling does not wake it to start the grandchild again.
fn no_slot_monopoly(mode: &'static str, launcher: Launcher) {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let config = serde_json::json!({
        "agent": { "command": ["/bin/sh", "-c", MONOPOLY], "retries": 0, "timeout_secs": 10, "kill_grace_secs": 1 },
    });
    let m = launcher.mount(&config, mode);
    let mode = format!("{mode}, {}", launcher.kind());
    std::fs::write(m.path().join("smiths/smith-root/inbox/task-1.md"), "t\n").expect("task");
    let mid = "smiths/smith-root/children/smith-001";
    let (log, meta) = ended_run(&m, mid, 1, 60);
    assert_eq!(meta["exit_code"], 0, "[{mode}] {meta}\n{log}");
    let grandchild = format!("{mid}/children/smith-001/conversations/run-0001/meta.json");
    poll_until(60, "the grandchild's run", || {
        m.path().join(&grandchild).exists()
    });
    let cancel = smithfs([
        std::ffi::OsStr::new("cancel"),
        m.path().as_os_str(),
        std::ffi::OsStr::new("smith-root/smith-001"),
    ]);
    cancel.expect_ok("cancel smith-root/smith-001");
    let status = smithfs([
        std::ffi::OsStr::new("status"),
        m.path().as_os_str(),
        std::ffi::OsStr::new("--json"),
    ])
    .expect_ok("status");
    let status: serde_json::Value = serde_json::from_str(&status).expect("status JSON");
    let state = |full: &str| {
        status["smiths"]
            .as_array()
            .and_then(|a| a.iter().find(|s| s["full_id"] == full))
            .map(|s| s["state"].as_str().unwrap_or_default().to_owned())
            .unwrap_or_default()
    };
    assert_eq!(
        state("smith-root/smith-001"),
        "cancelled",
        "[{mode}] {status}"
    );
    assert_eq!(
        state("smith-root/smith-001/smith-001"),
        "cancelled",
        "[{mode}] {status}"
    );
    assert!(
        !m.path()
            .join(format!("{mid}/conversations/run-0002"))
            .exists(),
        "[{mode}] the cancelled smith was woken and ran again"
    );
    // The ten-year run is the operator's to stop: its ten-year grace is the mount-wide 1 s.
    let hung = "smiths/smith-root/children/smith-002/conversations/run-0001/meta.json";
    poll_until(60, "smith-002's run", || m.path().join(hung).exists());
    let started = std::time::Instant::now();
    smithfs([
        std::ffi::OsStr::new("cancel"),
        m.path().as_os_str(),
        std::ffi::OsStr::new("smith-root/smith-002"),
    ])
    .expect_ok("cancel smith-root/smith-002");
    let (log, meta) = ended_run(&m, "smiths/smith-root/children/smith-002", 1, 60);
    assert_eq!(meta["cancelled"], true, "[{mode}] {meta}\n{log}");
    assert_eq!(
        meta["signal"], 9,
        "[{mode}] KILLed after the grace: {meta}\n{log}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "[{mode}] {meta}"
    );
}

#[test]
fn a_parent_cannot_monopolise_the_slots_cgroup() {
    no_slot_monopoly("cgroup", Launcher::Local);
}

#[test]
fn a_parent_cannot_monopolise_the_slots_loopback_cgroup() {
    no_slot_monopoly("cgroup", Launcher::Loopback);
}

#[test]
fn a_parent_cannot_monopolise_the_slots_ancestry() {
    no_slot_monopoly("ancestry", Launcher::Local);
}

#[test]
fn a_parent_cannot_monopolise_the_slots_loopback_ancestry() {
    no_slot_monopoly("ancestry", Launcher::Loopback);
}

const STUBBORN: &str = r#"
cd "$SMITH_DIR"
hang='{"agent": {"command": ["/bin/sh", "-c", "trap \"\" TERM; sleep 1000 & setsid sleep 1000 & while :; do sleep 1; done"], "timeout_secs": 315360000, "kill_grace_secs": 315360000}}'
case "$SMITH_FULL_ID:$SMITH_WAKE" in
  smith-root:task)
    mkdir children/smith-001
    printf '%s' "$hang" > children/smith-001/config.json
    echo t > children/smith-001/inbox/task-1.md ;;
  smith-root:children)
    [ -e private/again ] || { : > private/again; echo t > children/smith-001/inbox/task-2.md; } ;;
esac
echo done > outbox/result.md
"#;

/// A process of a run: its host pid and start time (`/proc/PID/stat` field 22), so a pid
/// number reused later is not taken for it.
type Proc = (i32, u64);

/// The start time of `pid`, if it is alive and not a zombie.
fn live_start(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state); field 22 is the start time.
    if matches!(fields.first(), Some(&"Z") | Some(&"X")) {
        return None;
    }
    fields.get(19)?.parse().ok()
}

/// Every process of the run whose leader (its sandbox's init) is `leader`: its process group,
/// its pid namespace (where a `setsid` child still is) and, in cgroup mode, its cgroup.
fn run_processes(leader: i32, cgroup: Option<&str>) -> Vec<Proc> {
    let ns = |pid: i32| std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok();
    let theirs = ns(leader);
    let mut pids: Vec<i32> = Vec::new();
    for p in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        // SAFETY: getpgid only reads the process's group.
        let pgid = unsafe { libc::getpgid(pid) };
        if pgid == leader || (theirs.is_some() && ns(pid) == theirs) {
            pids.push(pid);
        }
    }
    if let Some(cg) = cgroup {
        let procs = std::fs::read_to_string(format!("{cg}/cgroup.procs")).unwrap_or_default();
        pids.extend(procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    }
    pids.sort_unstable();
    pids.dedup();
    pids.into_iter()
        .filter_map(|p| live_start(p).map(|t| (p, t)))
        .collect()
}

/// Is any of `procs` still alive (same pid, same start time, not a zombie)?
fn any_alive(procs: &[Proc]) -> Vec<Proc> {
    procs
        .iter()
        .copied()
        .filter(|(p, t)| live_start(*p) == Some(*t))
        .collect()
}

/// The processes of `smith-root/smith-001`'s run `n` once it runs: its leader, its shell and
/// both `sleep 1000` (one of them `setsid`).
fn stubborn_run(m: &TestMount, n: u32) -> (serde_json::Value, Vec<Proc>) {
    let meta = m.path().join(format!(
        "smiths/smith-root/children/smith-001/conversations/run-{n:04}/meta.json"
    ));
    let meta: serde_json::Value = poll_until(60, "the stubborn run to start", || {
        serde_json::from_str(&std::fs::read_to_string(&meta).ok()?).ok()
    });
    let leader = meta["pid"].as_i64().expect("the run's pid") as i32;
    let cgroup = meta["cgroup"].as_str().map(str::to_owned);
    let procs = poll_until(60, "the run's two `sleep 1000`", || {
        let procs = run_processes(leader, cgroup.as_deref());
        let sleeps = procs
            .iter()
            .filter(|(p, _)| {
                std::fs::read(format!("/proc/{p}/cmdline"))
                    .is_ok_and(|c| c.split(|b| *b == 0).nth(1) == Some(b"1000"))
            })
            .count();
        (sleeps == 2).then_some(procs)
    });
    (meta, procs)
}

/// The operator cancels a run that ignores TERM (its agent and its children, one of them
/// `setsid`, have TERM ignored; its own `config.json` asks a ten-year grace): `smithfs cancel`
/// returns 0 and every process the run had is gone within the mount-wide 1 s grace and a few
/// seconds, KILLed (`meta.json`: `cancelled`, signal 9; notes H21). The first time, the parent,
/// woken by the cancelled child's settling (`children.settled`), gives it a new task at once, so
/// the child runs again while `cancel` is still waiting: the cancel is in effect all the same
/// (before H21's fix `cancel` read only the status, missed the moment it showed `cancelled`
/// and gave up after 41 s). The second time the parent leaves it, and it stays `cancelled`.
fn cancel_stubborn(mode: &'static str) {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let config = serde_json::json!({
        "agent": { "command": ["/bin/sh", "-c", STUBBORN], "retries": 0, "timeout_secs": 30, "kill_grace_secs": 1 },
    });
    let m = TestMount::with_config(&config, mode, Vec::new());
    std::fs::write(m.path().join("smiths/smith-root/inbox/task-1.md"), "t\n").expect("task");
    let child = "smiths/smith-root/children/smith-001";
    for n in [1, 2] {
        let (started, procs) = stubborn_run(&m, n);
        let t0 = std::time::Instant::now();
        let out = smithfs([
            std::ffi::OsStr::new("cancel"),
            m.path().as_os_str(),
            std::ffi::OsStr::new("smith-root/smith-001"),
        ])
        .expect_ok(&format!("[{mode}] cancel #{n}"));
        let returned = t0.elapsed();
        let left = poll_until(10, "the run's processes to be gone", || {
            let left = any_alive(&procs);
            left.is_empty().then_some(t0.elapsed())
        });
        eprintln!(
            "[{mode}] cancel #{n}: returned after {returned:?} ({}), {} processes gone after {left:?}",
            out.trim(),
            procs.len()
        );
        assert!(
            left < std::time::Duration::from_secs(1 + 10),
            "[{mode}] run {n}: {procs:?} gone only after {left:?} ({started})"
        );
        let (log, meta) = ended_run(&m, child, n, 10);
        assert_eq!(meta["cancelled"], true, "[{mode}] {meta}\n{log}");
        assert_eq!(meta["signal"], 9, "[{mode}] KILLed: {meta}\n{log}");
    }
    let status = smithfs([
        std::ffi::OsStr::new("status"),
        m.path().as_os_str(),
        std::ffi::OsStr::new("--json"),
    ])
    .expect_ok("status");
    let status: serde_json::Value = serde_json::from_str(&status).expect("status JSON");
    let row = status["smiths"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["full_id"] == "smith-root/smith-001"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(row["state"], "cancelled", "[{mode}] {status}");
    assert!(
        !m.path().join(child).join("conversations/run-0003").exists(),
        "[{mode}] a third run"
    );
}

#[test]
fn a_cancelled_run_that_ignores_term_is_killed_after_the_grace_cgroup() {
    cancel_stubborn("cgroup");
}

#[test]
fn a_cancelled_run_that_ignores_term_is_killed_after_the_grace_ancestry() {
    cancel_stubborn("ancestry");
}

const FLOOD: &str = r#"
cd "$SMITH_DIR"
case "$SMITH_FULL_ID" in
  smith-root)
    touch inbox/evidence 2>/dev/null
    mkdir children/smith-001
    perl -e 'for my $i (1..2000) { my $f = "children/smith-001/inbox/task-x$i \$.md"; open(my $h, ">", $f) or die "$f: $!"; close $h; unlink $f }
             for (1..300) { open(my $h, ">", "children/smith-001/inbox/task-1.md") or die $!; print $h "t\n"; close $h }' || exit 7
    echo done > outbox/result.md ;;
  *) echo done > outbox/result.md ;;
esac
"#;

/// Inbox names cannot flood the journal or the daemon's memory (notes H22): a parent creates
/// and removes 2 000 distinct malformed task names in its child's inbox, then rewrites one
/// valid task 300 times while the child's run is queued. `task.ignored` is journaled at most 20
/// a second per inbox in full, the rest as one line a second with `count` (every name counted);
/// the rewrites are one or two `task.assigned` (was 300); the parent's earlier `access.denied` is still in the
/// journal.
fn no_ignored_flood(mode: &'static str, launcher: Launcher) {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let config = serde_json::json!({
        "agent": { "command": ["/bin/sh", "-c", FLOOD], "retries": 0 },
        "scheduler": { "max_concurrent": 1 },
    });
    let m = launcher.mount(&config, mode);
    let mode = format!("{mode}, {}", launcher.kind());
    std::fs::write(m.path().join("smiths/smith-root/inbox/task-1.md"), "t\n").expect("task");
    let (log, meta) = ended_run(&m, "smiths/smith-root", 1, 120);
    assert_eq!(meta["exit_code"], 0, "[{mode}] {meta}\n{log}");
    let child = "smiths/smith-root/children/smith-001";
    let (log, meta) = ended_run(&m, child, 1, 60);
    assert_eq!(meta["exit_code"], 0, "[{mode}] {meta}\n{log}");
    let events = || -> Vec<serde_json::Value> {
        let text =
            std::fs::read_to_string(m.path().join(".smithfs/events.jsonl")).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    let evs = poll_until(30, "every ignored name counted", || {
        let evs = events();
        let counted: u64 = evs
            .iter()
            .filter(|e| e["event"] == "task.ignored")
            .map(|e| e["count"].as_u64().unwrap_or(1))
            .sum();
        (counted >= 2000).then_some(evs)
    });
    let ignored: Vec<_> = evs
        .iter()
        .filter(|e| e["event"] == "task.ignored")
        .collect();
    let full = ignored.iter().filter(|e| e["count"].is_null()).count();
    assert!(
        ignored.len() < 300 && full < 250,
        "[{mode}] {} task.ignored lines ({full} in full) for 2 000 names",
        ignored.len()
    );
    let assigned: Vec<_> = evs
        .iter()
        .filter(|e| e["event"] == "task.assigned" && e["smith"] == "smith-root/smith-001")
        .collect();
    // One for the run the rewrites merge into; a second when the child's run started before
    // the last rewrites' completions were handled (a rewrite after a run start is new work).
    assert!(
        (1..=2).contains(&assigned.len()),
        "[{mode}] {} task.assigned for 300 rewrites: {assigned:#?}",
        assigned.len()
    );
    assert!(
        evs.iter()
            .any(|e| e["event"] == "access.denied" && e["smith"] == "smith-root"),
        "[{mode}] the parent's access.denied is gone"
    );
}

#[test]
fn inbox_names_do_not_flood_the_journal_cgroup() {
    no_ignored_flood("cgroup", Launcher::Local);
}

#[test]
fn inbox_names_do_not_flood_the_journal_loopback_cgroup() {
    no_ignored_flood("cgroup", Launcher::Loopback);
}

#[test]
fn inbox_names_do_not_flood_the_journal_ancestry() {
    no_ignored_flood("ancestry", Launcher::Local);
}

#[test]
fn inbox_names_do_not_flood_the_journal_loopback_ancestry() {
    no_ignored_flood("ancestry", Launcher::Loopback);
}

const PUBLISH_FLOOD: &str = r#"
cd "$SMITH_DIR"
case "$SMITH_FULL_ID" in
  smith-root)
    touch inbox/evidence 2>/dev/null
    mkdir children/smith-001 && echo t > children/smith-001/inbox/task-1.md
    perl -e 'my $t = time; my $n = 0;
             while (time - $t < 3 || (!-e "children/smith-001/outbox/result.md" && time - $t < 30)) {
               open(my $h, ">", "private/r") or die $!; close $h;
               rename("private/r", "outbox/result.md") or die $!; $n++ }
             printf "published %d in %d s\n", $n, time - $t' || exit 7 ;;
  *) echo done > private/r && mv private/r outbox/result.md ;;
esac
"#;

/// `result.published` cannot flood the journal or the hooks (notes H24, hostile review 04): the
/// root publishes in a loop (a rename onto `outbox/result.md`, thousands a second) until its
/// child has published once, with a hook on `result.published` that lives 1 s. The root's
/// publishes are journaled at most 5 a second in full (the rest counted in
/// `result.published.suppressed`, every publish counted), so its earlier `access.denied` is
/// still in the journal; the child's publish is journaled and its hook runs (is not "not
/// started").
fn no_publish_flood(mode: &'static str) {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let config = serde_json::json!({
        "agent": { "command": ["/bin/sh", "-c", PUBLISH_FLOOD], "retries": 0 },
        "scheduler": { "max_concurrent": 2 },
        "hooks": { "result.published": [["/bin/sh", "-c", "sleep 1"]] },
    });
    let m = TestMount::with_config(&config, mode, Vec::new());
    std::fs::write(m.path().join("smiths/smith-root/inbox/task-1.md"), "t\n").expect("task");
    let (log, meta) = ended_run(&m, "smiths/smith-root", 1, 120);
    assert_eq!(meta["exit_code"], 0, "[{mode}] {meta}\n{log}");
    let (n, secs) = log
        .lines()
        .find_map(|l| {
            let mut w = l.strip_prefix("published ")?.split(' ');
            Some((
                w.next()?.parse::<u64>().ok()?,
                w.nth(1)?.parse::<u64>().ok()?,
            ))
        })
        .unwrap_or_else(|| panic!("[{mode}] no count in the log:\n{log}"));
    assert!(
        n > 200,
        "[{mode}] the flood flooded: {n} publishes in {secs} s"
    );
    let events = || -> Vec<serde_json::Value> {
        let text =
            std::fs::read_to_string(m.path().join(".smithfs/events.jsonl")).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    let root_published = |e: &serde_json::Value| {
        e["smith"] == "smith-root"
            && (e["event"] == "result.published" || e["event"] == "result.published.suppressed")
    };
    let evs = poll_until(30, "every publish counted, the child's hook ended", || {
        let evs = events();
        let counted: u64 = evs
            .iter()
            .filter(|e| root_published(e))
            .map(|e| e["count"].as_u64().unwrap_or(1))
            .sum();
        let hook = evs.iter().any(|e| {
            e["event"] == "hook.exited"
                && e["hook_event"] == "result.published"
                && e["smith"] == "smith-root/smith-001"
        });
        (counted >= n && hook).then_some(evs)
    });
    let full = evs
        .iter()
        .filter(|e| e["smith"] == "smith-root" && e["event"] == "result.published")
        .count() as u64;
    eprintln!("[{mode}] {n} publishes in {secs} s: {full} result.published lines in full");
    assert!(
        full <= 5 * (secs + 2),
        "[{mode}] {full} result.published lines in full for {n} publishes in {secs} s"
    );
    let child_hook: Vec<_> = evs
        .iter()
        .filter(|e| {
            e["event"] == "hook.exited"
                && e["hook_event"] == "result.published"
                && e["smith"] == "smith-root/smith-001"
        })
        .collect();
    assert!(
        child_hook.iter().all(|e| e["exit_code"] == 0),
        "[{mode}] the child's hook did not run: {child_hook:#?}"
    );
    assert!(
        evs.iter()
            .any(|e| e["event"] == "access.denied" && e["smith"] == "smith-root"),
        "[{mode}] the root's access.denied is gone"
    );
}

#[test]
fn result_publishes_do_not_flood_the_journal_or_the_hooks_cgroup() {
    no_publish_flood("cgroup");
}

#[test]
fn result_publishes_do_not_flood_the_journal_or_the_hooks_ancestry() {
    no_publish_flood("ancestry");
}
