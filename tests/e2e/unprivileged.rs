//! The unprivileged path (issue 2, "Done when"): a non-root user inits, mounts through the
//! setuid `fusermount3`, uses and unmounts a smithfs directory it owns.
//!
//! The machine's `/dev/fuse` may be root-only (`crw-------`): the test grants world access for
//! its own duration with `DevFuseGrant`, which restores the original mode on drop (even when the
//! test panics) and holds a file lock that serialises every test touching `/dev/fuse`.

use crate::common;

use std::ffi::OsStr;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use common::user::*;
use common::*;

/// The `doctor --json` checks of `out` (its stdout), and the one named `name`.
fn doctor_check(out: &str, name: &str) -> (serde_json::Value, serde_json::Value) {
    let checks: serde_json::Value = serde_json::from_str(out).expect("doctor --json");
    let one = checks
        .as_array()
        .expect("a list")
        .iter()
        .find(|c| c["check"] == name)
        .unwrap_or_else(|| panic!("no {name} check in {checks}"))
        .clone();
    (checks, one)
}

#[test]
fn a_non_root_user_mounts_through_fusermount3_and_uses_the_mount() {
    let Some((grant, uid, gid)) = granted_user() else {
        return;
    };
    let m = UserMount::init(uid, gid);

    // doctor tells the truth before the mount: nothing fails, so the mount works.
    let d = smithfs_as(uid, gid, &[OsStr::new("doctor"), OsStr::new("--json")]);
    assert_eq!(d.code, Some(0), "{d:?}");
    let (checks, dev) = doctor_check(&d.stdout, "/dev/fuse");
    assert_eq!(dev["status"], "ok", "{checks}");
    assert!(
        checks
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["status"] != "fail"),
        "{checks}"
    );

    smithfs_as(uid, gid, &[OsStr::new("mount"), m.path().as_os_str()])
        .expect_ok("mount as the user");
    let (fstype, source) = mount_at(m.path()).expect("a mount after `smithfs mount`");
    assert_eq!(source, "smithfs");
    // docs/SPEC.md §6: every mount, root or not, has the type fuse.smithfs.
    assert_eq!(fstype, "fuse.smithfs");
    let found = run(Command::new("findmnt")
        .args(["-n", "-o", "TARGET", "-t", "fuse.smithfs"])
        .arg("--mountpoint")
        .arg(m.path()))
    .expect_ok("findmnt -t fuse.smithfs");
    assert_eq!(found.trim(), m.path().to_str().unwrap());
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = info
        .lines()
        .rfind(|l| l.split(' ').nth(4) == m.path().to_str())
        .unwrap();
    assert!(line.contains(&format!("user_id={uid}")), "{line}");
    // The daemon runs as the user, not as root.
    let pid = find_daemon(m.path()).expect("daemon");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid_line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert!(
        uid_line
            .split_whitespace()
            .skip(1)
            .all(|u| u == uid.to_string()),
        "{uid_line}"
    );

    // The user works inside the mount.
    let out = m
        .sh(
            "mkdir -p work/sub && echo hello > work/sub/f && mv work/sub/f work/g && ln -s g work/l && \
             ln work/g work/h && chmod 600 work/g && cat work/l && stat -c '%u:%g %a %h' work/g && \
             python3 -c 'import os; os.setxattr(\"work/g\", \"user.k\", b\"v\"); print(os.getxattr(\"work/g\", \"user.k\").decode())' && \
             ls -a | grep -c smithfs-state || true",
        )
        .expect_ok("work as the user");
    assert_eq!(out, format!("hello\n{uid}:{gid} 600 2\nv\n0\n"));
    // The mount is the user's: without allow_other, even root is kept out.
    let err = std::fs::metadata(m.path().join("work")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EACCES), "{err}");
    // A second user-mount of the same dir is refused.
    let r = smithfs_as(uid, gid, &[OsStr::new("mount"), m.path().as_os_str()]);
    assert!(!r.ok() && r.stderr.contains("smithfs umount"), "{r:?}");

    // The user unmounts (fusermount3 -u); the store holds the work, owned by the user.
    smithfs_as(uid, gid, &[OsStr::new("umount"), m.path().as_os_str()])
        .expect_ok("umount as the user");
    assert!(!is_smithfs_mounted(m.path()));
    let g = std::fs::metadata(m.path().join("work/g")).unwrap();
    assert_eq!((g.uid(), g.gid(), g.nlink()), (uid, gid, 2));
    assert_eq!(
        std::fs::read_to_string(m.path().join("work/h")).unwrap(),
        "hello\n"
    );
    assert!(m.path().join(".smithfs-state").is_dir());
    drop(m);
    drop(grant);
}

#[test]
fn without_access_to_dev_fuse_mount_fails_with_one_line_and_mounts_nothing() {
    if !is_root() {
        eprintln!("skipped: needs root to create the test user");
        return;
    }
    let _lock = DevFuseLock::acquire();
    let mode = std::fs::metadata("/dev/fuse").unwrap().permissions().mode();
    if mode & 0o006 == 0o006 {
        eprintln!("skipped: /dev/fuse is world-accessible on this machine ({mode:o})");
        return;
    }
    let (uid, gid) = test_user();
    let m = UserMount::init(uid, gid);
    // doctor tells the truth first: /dev/fuse fails, exit 1, in both forms.
    let d = smithfs_as(uid, gid, &[OsStr::new("doctor")]);
    assert_eq!(d.code, Some(1), "{d:?}");
    let line = d
        .stdout
        .lines()
        .find(|l| l.contains("/dev/fuse"))
        .unwrap_or_default();
    assert!(
        line.starts_with("FAIL") && line.contains("chmod 0666 /dev/fuse"),
        "{d:?}"
    );
    let d = smithfs_as(uid, gid, &[OsStr::new("doctor"), OsStr::new("--json")]);
    assert_eq!(d.code, Some(1), "{d:?}");
    let (checks, dev) = doctor_check(&d.stdout, "/dev/fuse");
    assert_eq!(dev["status"], "fail", "{checks}");

    let r = smithfs_as(uid, gid, &[OsStr::new("mount"), m.path().as_os_str()]);
    assert!(!r.ok(), "{r:?}");
    assert_eq!(r.stderr.trim().lines().count(), 1, "one line: {r:?}");
    assert!(r.stderr.contains("mount"), "{r:?}");
    assert!(r.stderr.contains("chmod 0666 /dev/fuse"), "{r:?}");
    assert!(!is_smithfs_mounted(m.path()));
    assert!(find_daemon(m.path()).is_none(), "a daemon was left behind");
    // Nothing was lost: the store is as init left it.
    assert!(m.path().join("config.json").is_file());
}

/// doctor and mount agree when `fusermount3` is missing (not on PATH): `/dev/fuse` is
/// accessible, but the kernel refuses an unprivileged mount(2), so there is no way to mount —
/// doctor fails naming fusermount3 and the mount fails with one line saying the same.
#[test]
fn without_fusermount3_doctor_and_mount_both_fail() {
    let Some((grant, uid, gid)) = granted_user() else {
        return;
    };
    let m = UserMount::init(uid, gid);
    let bare = |args: &[&OsStr]| {
        run(Command::new("/usr/bin/setpriv")
            .arg(format!("--reuid={uid}"))
            .arg(format!("--regid={gid}"))
            .arg("--clear-groups")
            .arg("--")
            .arg(SMITHFS)
            .args(args)
            .env("PATH", "/nonexistent"))
    };
    let d = bare(&[OsStr::new("doctor"), OsStr::new("--json")]);
    assert_eq!(d.code, Some(1), "{d:?}");
    let (checks, fm) = doctor_check(&d.stdout, "fusermount3");
    assert_eq!(fm["status"], "fail", "{checks}");
    let r = bare(&[OsStr::new("mount"), m.path().as_os_str()]);
    assert!(!r.ok(), "{r:?}");
    assert_eq!(r.stderr.trim().lines().count(), 1, "one line: {r:?}");
    assert!(r.stderr.contains("fusermount3 is not installed"), "{r:?}");
    assert!(!is_smithfs_mounted(m.path()));
    drop(m);
    drop(grant);
}

/// Workspaces need a root daemon (docs/PROTOCOL-NOTES.md W1): a non-root user may `init --repo`
/// a repository of its own, but mounting it is refused with one line that says why, and nothing
/// is mounted.
#[test]
fn a_non_root_mount_with_a_workspace_is_refused_in_one_line() {
    let Some((_grant, uid, gid)) = granted_user() else {
        return;
    };
    let tmp = tempfile::Builder::new()
        .prefix("smithfs-unpriv-ws-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let home = tmp.path().join("home");
    std::fs::create_dir(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(uid), Some(gid)).unwrap();
    let r = sh_as(
        uid,
        gid,
        &home,
        "export HOME=$PWD; mkdir repo && cd repo && git init -q . && echo x > a.txt && git add a.txt \
         && git -c user.name=u -c user.email=u@e commit -qm one",
    );
    assert!(r.ok(), "{r:?}");
    let m = home.join("m");
    let repo = home.join("repo");
    smithfs_as(
        uid,
        gid,
        &[
            OsStr::new("init"),
            m.as_os_str(),
            OsStr::new("--repo"),
            repo.as_os_str(),
        ],
    )
    .expect_ok("init --repo as the user");
    let r = smithfs_as(uid, gid, &[OsStr::new("mount"), m.as_os_str()]);
    assert!(!r.ok(), "an unprivileged workspace mount worked: {r:?}");
    assert_eq!(r.stderr.trim().lines().count(), 1, "one line: {r:?}");
    assert!(
        r.stderr.contains("workspace") && r.stderr.contains("root"),
        "{r:?}"
    );
    assert!(!is_smithfs_mounted(&m));
}

/// doctor's `privileges` line is true about `allow_other`: without `user_allow_other` in
/// /etc/fuse.conf it says `--allow-other` is refused, and `mount -o allow_other` as the user
/// fails with one line naming user_allow_other (fusermount3's reason), mounting nothing.
#[test]
fn allow_other_without_user_allow_other_is_refused_as_doctor_says() {
    let conf = std::fs::read_to_string("/etc/fuse.conf").unwrap_or_default();
    if conf.lines().any(|l| l.trim() == "user_allow_other") {
        eprintln!("skipped: /etc/fuse.conf has user_allow_other on this machine");
        return;
    }
    let Some((grant, uid, gid)) = granted_user() else {
        return;
    };
    let m = UserMount::init(uid, gid);
    let d = smithfs_as(uid, gid, &[OsStr::new("doctor"), OsStr::new("--json")]);
    let (checks, p) = doctor_check(&d.stdout, "privileges");
    assert_eq!(p["status"], "warn", "{checks}");
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("--allow-other refused"),
        "{checks}"
    );
    let r = smithfs_as(
        uid,
        gid,
        &[
            OsStr::new("mount"),
            m.path().as_os_str(),
            OsStr::new("-o"),
            OsStr::new("allow_other"),
        ],
    );
    assert!(!r.ok(), "{r:?}");
    assert_eq!(r.stderr.trim().lines().count(), 1, "one line: {r:?}");
    assert!(r.stderr.contains("user_allow_other"), "{r:?}");
    assert!(!is_smithfs_mounted(m.path()));
    drop(m);
    drop(grant);
}

/// A process of the test user, outside every run (killed and reaped on drop).
struct UserProcess(std::process::Child);

impl UserProcess {
    fn start(uid: u32, gid: u32, argv: &[&OsStr], vars: &[(&str, &OsStr)]) -> UserProcess {
        let mut cmd = Command::new("setpriv");
        cmd.arg(format!("--reuid={uid}"))
            .arg(format!("--regid={gid}"))
            .arg("--clear-groups")
            .arg("--")
            .args(argv)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        for (k, v) in vars {
            cmd.env(k, v);
        }
        UserProcess(cmd.spawn().expect("spawn a process as the test user"))
    }
}

impl Drop for UserProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What a run of a non-root daemon must show (tests/fixtures/escapes.sh's output with
/// `SANDBOXED=1 LAYERS=1`): nothing got out, it is the daemon's uid (not 0) with one group, no
/// capability, `no_new_privs`, under the seccomp filter, bound as smith-root.
fn check_rootless(out: &str, uid: u32, what: &str) {
    check_nothing_escaped(out, uid, what);
    for line in ["Seccomp: 2", "full id: smith-root\n"] {
        assert!(out.contains(line), "[{what}] no {line:?}:\n{out}");
    }
}

/// A daemon that is not root sandboxes its runs in a user namespace per run (docs/SPEC.md §12
/// "Without root"), as a real non-root user through fusermount3: `doctor` says it is given,
/// the mount starts, and every route of tests/fixtures/escapes.sh (part one's view and the
/// kernel-enforced layers) fails from a run the scheduler started and from `smithfs run` — the
/// same uid as the daemon, a sibling run, the user's own processes and an abstract socket
/// outside notwithstanding. The runs' uid is the user's inside too (`uid_map` maps it to
/// itself, never to 0), and what a run creates belongs to the user.
#[test]
fn a_non_root_daemon_sandboxes_its_runs() {
    use std::os::linux::net::SocketAddrExt;
    let Some((_grant, uid, gid)) = granted_user() else {
        return;
    };
    let tmp = tempfile::Builder::new()
        .prefix("smithfs-unpriv-sb-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let home = tmp.path().join("home");
    std::fs::create_dir(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(uid), Some(gid)).unwrap();
    // The script, a file outside the view and a writable share, where the user can reach them
    // (a daemon that is not root sees only what its user may).
    let script = tmp.path().join("escapes.sh");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/escapes.sh"),
        &script,
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let outside = tmp.path().join("outside.txt");
    std::fs::write(&outside, "the user's, outside the view\n").unwrap();
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o644)).unwrap();
    let share = tmp.path().join("share");
    std::fs::create_dir(&share).unwrap();
    std::os::unix::fs::chown(&share, Some(uid), Some(gid)).unwrap();
    // The user's own process outside every run, named by a pid file in the writable share
    // (same uid as the runs: only the pid namespace and Landlock's scoping stand between).
    let victim = UserProcess::start(uid, gid, &[OsStr::new("sleep"), OsStr::new("300")], &[]);
    let pidfile = share.join("victim.pid");
    std::fs::write(&pidfile, victim.0.id().to_string()).unwrap();
    let name = format!("smithfs-rootless-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let listener = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    listener.set_nonblocking(true).unwrap();

    let m = home.join("m");
    smithfs_as(uid, gid, &[OsStr::new("init"), m.as_os_str()]).expect_ok("init as the user");
    let vars = [
        ("SANDBOXED", "1".to_string()),
        ("LAYERS", "1".to_string()),
        ("OUTSIDE", outside.to_string_lossy().into_owned()),
        ("SMITHFS_BIN", SMITHFS.to_string()),
        ("AGENT_PROG", script.to_string_lossy().into_owned()),
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
    std::fs::write(m.join("config.json"), config.to_string()).unwrap();
    std::os::unix::fs::chown(m.join("config.json"), Some(uid), Some(gid)).unwrap();

    // doctor says what this host gives a non-root daemon.
    let d = sandboxed_as(uid, gid, &[], &[OsStr::new("doctor"), OsStr::new("--json")]);
    let (checks, sandbox) = doctor_check(&d.stdout, "sandbox");
    assert_eq!(sandbox["status"], "ok", "{checks}");
    assert!(
        sandbox["detail"]
            .as_str()
            .unwrap_or("")
            .contains("a user namespace per run"),
        "{sandbox}"
    );
    let (_, ns) = doctor_check(&d.stdout, "namespaces");
    assert_eq!(ns["status"], "ok", "{checks}");

    sandboxed_as(uid, gid, &[], &[OsStr::new("mount"), m.as_os_str()])
        .expect_ok("a sandboxed mount as the user");
    let mounted = UserMount {
        tmp: tempfile::tempdir().unwrap(),
        dir: m.clone(),
        uid,
        gid,
    };
    let in_mount = |script: &str| sh_as(uid, gid, &home, &format!("cd m && {script}"));
    // A sibling: another smith's process, through `smithfs run` as the user (sandboxed too).
    in_mount("mkdir smiths/smith-root/children/smith-001").expect_ok("mkdir smith-001");
    let sibling = UserProcess::start(
        uid,
        gid,
        &[
            OsStr::new(SMITHFS),
            OsStr::new("run"),
            OsStr::new("--mount"),
            m.as_os_str(),
            OsStr::new("--smith"),
            OsStr::new("smith-root/smith-001"),
            OsStr::new("--"),
            OsStr::new("sleep"),
            OsStr::new("120"),
        ],
        &[],
    );
    in_mount(&format!(
        "printf 'escape\\nsibling: {}\\n' > smiths/smith-root/inbox/task-1.md",
        sibling.0.id()
    ))
    .expect_ok("task");
    let (log, meta) = mounted.ended_run("smiths/smith-root", 1, 90);
    assert!(meta["error"].is_null(), "{meta}\n{log}");
    check_rootless(&log, uid, "non-root daemon, scheduler");

    // `smithfs run` as the user: the same sandbox, built by a process that is not root; its uid
    // inside maps to itself, and what it writes is the user's.
    let mut argv: Vec<&OsStr> = vec![
        OsStr::new("run"),
        OsStr::new("--mount"),
        m.as_os_str(),
        OsStr::new("--smith"),
        OsStr::new("smith-root"),
        OsStr::new("--"),
        OsStr::new("/bin/bash"),
        script.as_os_str(),
    ];
    let sib = sibling.0.id().to_string();
    let mut with: Vec<(&str, &OsStr)> = vars.iter().map(|(k, v)| (*k, OsStr::new(v))).collect();
    with.push(("SIBLING", OsStr::new(&sib)));
    let out = sandboxed_as(uid, gid, &with, &argv);
    check_rootless(&out.stdout, uid, "non-root daemon, smithfs run");
    argv.truncate(6);
    argv.extend([
        OsStr::new("sh"),
        OsStr::new("-c"),
        OsStr::new("cat /proc/self/uid_map; id -u; echo made > \"$SMITH_DIR/outbox/made.txt\""),
    ]);
    let out = sandboxed_as(uid, gid, &[], &argv);
    let map: Vec<&str> = out
        .stdout
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let id = uid.to_string();
    assert_eq!(map, [id.as_str(), id.as_str(), "1"], "{out:?}");
    assert_eq!(out.stdout.lines().nth(1), Some(id.as_str()), "{out:?}");
    let owner = in_mount("stat -c %u:%g smiths/smith-root/outbox/made.txt").expect_ok("stat");
    assert_eq!(owner.trim(), format!("{uid}:{gid}"));

    assert!(
        matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "a run connected to the abstract socket"
    );
    // SAFETY: signal 0 to our own unreaped child.
    let alive = unsafe { libc::kill(victim.0.id() as i32, 0) } == 0;
    assert!(alive, "the user's process outside the runs died");
    let daemon = find_daemon(&m).expect("the daemon");
    // SAFETY: signal 0 only probes for existence.
    assert_eq!(unsafe { libc::kill(daemon, 0) }, 0, "the daemon died");
    drop(sibling);
    drop(mounted);
}
