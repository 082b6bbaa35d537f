//! FUSE over io_uring (issue 14): `mount --transport io-uring` registers one queue per possible
//! CPU and serves every request through them with the same identity, policy and passthrough as
//! `/dev/fuse`; unmount ends the queue threads; a SIGKILLed daemon leaves the mount failing
//! closed (ENOTCONN); `--transport dev-fuse` and `auto` with the switch off never use io_uring.
//!
//! The kernel offers io_uring at INIT only while the machine-wide
//! `/sys/module/fuse/parameters/enable_uring` is on: every mount here takes [`UringSwitch`]
//! (a file lock, so no two tests flip it at once) and restores the value it found as soon as
//! its INIT is done. The whole suite runs over io_uring with `SMITHFS_TEST_TRANSPORT=io-uring`.

use crate::common;

use std::ffi::OsStr;
use std::time::Duration;

use common::*;

/// Names of the daemon's threads.
fn thread_names(pid: i32) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
        .map(|s| s.trim().to_string())
        .collect()
}

fn uring_threads(pid: i32) -> usize {
    thread_names(pid)
        .iter()
        .filter(|n| n.starts_with("smithfs-uring-"))
        .count()
}

fn possible_cpus() -> usize {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible").expect("possible CPUs");
    s.trim()
        .split(',')
        .map(|p| match p.split_once('-') {
            Some((a, b)) => b.parse::<usize>().unwrap() - a.parse::<usize>().unwrap() + 1,
            None => 1,
        })
        .sum()
}

/// Voluntary context switches of the daemon's threads whose name starts with `prefix`.
fn switches(pid: i32, prefix: &str) -> u64 {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    dir.flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|n| n.trim().starts_with(prefix))
        })
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .filter_map(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .sum()
}

/// `argv` run in the mount bound to smith-root (`smithfs run --smith smith-root`).
fn as_root_smith(m: &TestMount, argv: &[&str]) -> Run {
    run(std::process::Command::new(SMITHFS)
        .args([
            OsStr::new("run"),
            OsStr::new("--mount"),
            m.path().as_os_str(),
        ])
        .args(["--smith", "smith-root", "--"])
        .args(argv)
        .current_dir(m.path()))
}

fn uring_mount() -> Option<TestMount> {
    if !UringSwitch::usable() {
        return None;
    }
    Some(TestMount::with(MountOpts {
        allow_other: true,
        extra: vec!["--transport", "io-uring"],
        ..MountOpts::default()
    }))
}

#[test]
fn io_uring_serves_every_queue_and_the_switch_is_restored() {
    let before = uring_resting_value();
    let Some(m) = uring_mount() else { return };
    // The switch is back as found once the mount is live (other mounts keep /dev/fuse).
    assert_eq!(uring_resting_value(), before);
    let pid = m.daemon_pid().expect("daemon");
    assert_eq!(
        uring_threads(pid),
        possible_cpus(),
        "{:?}",
        thread_names(pid)
    );
    // Requests go through the rings: the queue threads wake for them, /dev/fuse readers don't.
    let dev_before = switches(pid, "smithfs-fuse-");
    let ring_before = switches(pid, "smithfs-uring-");
    m.sh_ok(
        "mkdir -p results/d && for i in $(seq 1 200); do echo $i > results/d/f$i; done; \
         ls results/d | wc -l; cat results/d/f7; rm -r results/d",
    );
    let ring = switches(pid, "smithfs-uring-") - ring_before;
    let dev = switches(pid, "smithfs-fuse-") - dev_before;
    assert!(ring >= 200, "ring threads woke {ring} times");
    // FORGETs still come on /dev/fuse; nothing else does.
    assert!(
        dev < ring,
        "/dev/fuse readers woke {dev} times, rings {ring}"
    );
}

/// The scheduling policy (`/proc/PID/task/TID/stat` field 41: 0 normal, 5 `SCHED_IDLE`) of
/// each of the daemon's queue threads.
fn queue_policies(pid: i32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    dir.flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|n| n.trim().starts_with("smithfs-uring-"))
        })
        .filter_map(|t| std::fs::read_to_string(t.path().join("stat")).ok())
        .filter_map(|s| {
            // Fields after the parenthesised command name; policy is field 41 overall.
            let rest = s.rsplit_once(')')?.1;
            rest.split_whitespace().nth(38)?.parse().ok()
        })
        .collect()
}

/// Busy loops, one per CPU and one more, killed when dropped.
struct Hogs(Vec<std::process::Child>);

impl Drop for Hogs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn queue_threads_yield_while_the_cpus_idle_and_not_when_they_are_busy() {
    let Some(m) = uring_mount() else { return };
    let pid = m.daemon_pid().expect("daemon");
    let cpus = possible_cpus();
    // Requests from each CPU reach that CPU's queue, whose thread applies the policy asked for
    // before its next wait (docs/PROTOCOL-NOTES.md U8).
    let script: String = (0..cpus)
        .map(|c| format!("taskset -c {c} sh -c ': > results/p{c}; rm results/p{c}'; "))
        .collect();
    let all = |policy: u32| {
        let p = queue_policies(pid);
        p.len() == cpus && p.iter().all(|&x| x == policy)
    };
    // SCHED_IDLE (5) while the CPUs are idle at least 30 % of the time. Other tests may keep
    // them busier than that: then this half cannot be seen here.
    let end = std::time::Instant::now() + Duration::from_secs(5);
    let mut yielded = false;
    while !yielded && std::time::Instant::now() < end {
        m.sh_ok(&script);
        yielded = all(5);
        std::thread::sleep(Duration::from_millis(50));
    }
    if !yielded {
        eprintln!(
            "the CPUs were never idle enough to see SCHED_IDLE: {:?}",
            queue_policies(pid)
        );
    }
    // With every CPU busy, back to the normal policy (0): the watcher sets it on the sleeping
    // threads itself, no request needed.
    let _hogs = Hogs(
        (0..=cpus)
            .map(|_| {
                std::process::Command::new("sh")
                    .args(["-c", "while :; do :; done"])
                    .spawn()
                    .expect("busy loop")
            })
            .collect(),
    );
    poll_until(
        Duration::from_secs(15),
        "every queue thread at the normal policy while the CPUs are busy",
        || all(0),
    );
}

#[test]
fn identity_policy_and_passthrough_over_io_uring() {
    let Some(m) = uring_mount() else { return };
    // The operator, and a process bound to smith-root: the caller's pid reaches the daemon.
    let who = m.sh_ok("cat .smithfs/whoami");
    assert!(who.contains("operator"), "{who}");
    let out = as_root_smith(&m, &["cat", ".smithfs/whoami"]).expect_ok("whoami as smith-root");
    assert!(out.contains("smith-root"), "{out}");
    // Policy: a smith cannot write its child's private area (docs/SPEC.md §3) — same errno as
    // on /dev/fuse, and `why` explains it. (Its files are the agents' uid's, so the daemon,
    // not the kernel's mode check, refuses it also in the sandbox, §12.)
    m.sh_ok("mkdir smiths/smith-root/children/smith-001");
    let r = as_root_smith(
        &m,
        &[
            "sh",
            "-c",
            "echo x > smiths/smith-root/children/smith-001/private/x; cat .smithfs/why",
        ],
    );
    assert!(r.stderr.contains("Permission denied"), "{r:?}");
    assert!(
        r.stdout.contains("identity: smith-root") && r.stdout.contains("errno: EACCES"),
        "{r:?}"
    );
    // Passthrough: data written and read back through the kernel's backing file.
    let big = m.py_ok(
        "import os\n\
         data = os.urandom(3 << 20)\n\
         open('results/big', 'wb').write(data)\n\
         print(open('results/big', 'rb').read() == data)",
        &[],
    );
    assert_eq!(big.trim(), "True");
}

#[test]
fn unmount_ends_the_queue_threads() {
    let Some(mut m) = uring_mount() else { return };
    let pid = m.daemon_pid().expect("daemon");
    m.sh_ok("echo kept > results/f");
    // `umount` waits for the daemon to exit: every queue thread ended.
    m.umount();
    assert!(process_gone(pid));
    assert_eq!(
        std::fs::read_to_string(m.path().join("results/f")).unwrap(),
        "kept\n"
    );
}

#[test]
fn sigkilled_daemon_fails_closed() {
    let Some(m) = uring_mount() else { return };
    let pid = m.daemon_pid().expect("daemon");
    // SAFETY: kill of the daemon this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    poll_until(Duration::from_secs(10), "the daemon to die", || {
        process_gone(pid)
    });
    // Requests caught in the rings' teardown end with ECONNABORTED or ECANCELED; then every access
    // is ENOTCONN, as on /dev/fuse. Nothing ever succeeds.
    wait_enotconn(|| std::fs::metadata(m.path().join("config.json")).map(|_| ()));
    let err = std::fs::File::create(m.path().join("new")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTCONN), "{err}");
    assert!(is_smithfs_mounted(m.path()));
}

#[test]
fn dev_fuse_transport_never_uses_io_uring() {
    if !UringSwitch::usable() {
        return;
    }
    let _on = UringSwitch::on();
    let m = TestMount::with(MountOpts {
        allow_other: true,
        extra: vec!["--transport", "dev-fuse"],
        ..MountOpts::default()
    });
    let pid = m.daemon_pid().expect("daemon");
    assert_eq!(uring_threads(pid), 0, "{:?}", thread_names(pid));
    m.sh_ok("echo ok > results/f && cat results/f");
}

#[test]
fn io_uring_asked_while_switched_off_fails_the_mount_clearly() {
    if !UringSwitch::usable() {
        return;
    }
    let _off = UringSwitch::off();
    let tmp = tempfile::Builder::new()
        .prefix("smithfs-test-")
        .tempdir()
        .unwrap();
    let dir = tmp.path().join("m");
    smithfs([OsStr::new("init"), dir.as_os_str()]).expect_ok("init");
    let r = smithfs([
        OsStr::new("mount"),
        dir.as_os_str(),
        OsStr::new("--transport"),
        OsStr::new("io-uring"),
    ]);
    assert!(!r.ok(), "{r:?}");
    assert!(r.stderr.contains("io_uring"), "{r:?}");
    assert!(!is_smithfs_mounted(&dir));
    // `auto` with the switch off serves over /dev/fuse.
    let m = TestMount::with(MountOpts {
        allow_other: true,
        extra: vec!["--transport", "auto"],
        ..MountOpts::default()
    });
    assert_eq!(uring_threads(m.daemon_pid().expect("daemon")), 0);
}

/// Every operation, each with what it answered: the errno of a failure, else the stat fields
/// that are not times or inode numbers, data, listings and xattrs (one JSON line per step).
const EVERY_OPERATION: &str = r#"
import ctypes, errno, fcntl, hashlib, json, os, stat, sys
libc = ctypes.CDLL(None, use_errno=True)
out = []
def step(name, f):
    try:
        r = f()
    except OSError as e:
        r = "errno " + errno.errorcode.get(e.errno, str(e.errno))
    out.append([name, r])
def st(p, follow=True):
    s = os.stat(p) if follow else os.lstat(p)
    return [oct(s.st_mode), s.st_nlink, s.st_size, s.st_uid, s.st_gid, s.st_blocks]
def renameat2(a, b, flags):
    if libc.renameat2(-100, a.encode(), -100, b.encode(), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return "ok"
def write_new(p, data):
    fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o640)
    n = os.write(fd, data); os.fsync(fd); os.close(fd); return n
def read_all(p):
    fd = os.open(p, os.O_RDONLY)
    d = os.read(fd, 1 << 20); end = os.lseek(fd, 0, os.SEEK_END); mid = os.pread(fd, 7, 100)
    os.close(fd); return [len(d), hashlib.sha256(d).hexdigest()[:16], end, mid.hex()]
def fd_ops(p):
    fd = os.open(p, os.O_RDWR)
    try:
        r = [os.fstat(fd).st_size, os.lseek(fd, 0, os.SEEK_DATA), os.lseek(fd, 0, os.SEEK_HOLE)]
        fd2 = os.dup(fd); os.close(fd2)  # a FLUSH
        os.fdatasync(fd)
        return r
    finally:
        os.close(fd)
def ioctl(p):
    fd = os.open(p, os.O_RDONLY)
    try:
        return fcntl.ioctl(fd, 0x80086601, b"\0" * 8).hex()  # FS_IOC_GETFLAGS
    finally:
        os.close(fd)
def fsyncdir(p):
    fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY); os.fsync(fd); os.close(fd); return "ok"
def copy(a, b):
    i = os.open(a, os.O_RDONLY); o = os.open(b, os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        return os.copy_file_range(i, o, 1 << 20)
    finally:
        os.close(i); os.close(o)
def plus(d):
    return sorted([e.name, e.is_dir(follow_symlinks=False), e.is_symlink(), e.stat(follow_symlinks=False).st_size] for e in os.scandir(d))
os.chdir(sys.argv[1])
D = "results/ops"
step("mkdir", lambda: os.mkdir(D, 0o755) or st(D))
step("mkdir exists", lambda: os.mkdir(D))
step("create+write", lambda: write_new(D + "/f", b"smith" * 2000))
step("create exists", lambda: write_new(D + "/f", b"x"))
step("stat", lambda: st(D + "/f"))
step("read", lambda: read_all(D + "/f"))
step("open missing", lambda: os.open(D + "/nothing", os.O_RDONLY))
step("chmod", lambda: os.chmod(D + "/f", 0o600) or st(D + "/f"))
step("chown", lambda: os.chown(D + "/f", 0, 0) or st(D + "/f"))
step("utime", lambda: os.utime(D + "/f", ns=(1_000_000_123, 2_000_000_456)) or [os.stat(D + "/f").st_mtime_ns, os.stat(D + "/f").st_atime_ns])
step("truncate", lambda: os.truncate(D + "/f", 100) or st(D + "/f"))
step("fallocate", lambda: os.posix_fallocate(os.open(D + "/f", os.O_WRONLY), 0, 65536) or st(D + "/f"))
step("fd ops", lambda: fd_ops(D + "/f"))
step("ioctl", lambda: ioctl(D + "/f"))
step("copy_file_range", lambda: copy(D + "/f", D + "/g"))
step("read copy", lambda: read_all(D + "/g"))
step("symlink", lambda: os.symlink("f", D + "/l") or st(D + "/l", False))
step("readlink", lambda: os.readlink(D + "/l"))
step("link", lambda: os.link(D + "/f", D + "/f2") or st(D + "/f"))
step("mkfifo", lambda: os.mkfifo(D + "/p", 0o644) or st(D + "/p", False))
step("mknod chr", lambda: os.mknod(D + "/c", 0o644 | stat.S_IFCHR, os.makedev(1, 3)) or st(D + "/c", False))
step("rename", lambda: os.rename(D + "/f2", D + "/f3") or st(D + "/f3"))
step("rename noreplace", lambda: renameat2(D + "/f3", D + "/g", 1))
step("rename exchange", lambda: renameat2(D + "/f3", D + "/g", 2) or [st(D + "/f3"), st(D + "/g")])
step("setxattr", lambda: os.setxattr(D + "/f", "user.smith", b"agent") or "ok")
step("getxattr", lambda: os.getxattr(D + "/f", "user.smith").hex())
step("listxattr", lambda: sorted(os.listxattr(D + "/f")))
step("removexattr", lambda: os.removexattr(D + "/f", "user.smith") or "ok")
step("getxattr gone", lambda: os.getxattr(D + "/f", "user.smith"))
step("readdir", lambda: sorted(os.listdir(D)))
step("readdirplus", lambda: plus(D))
step("statfs", lambda: [os.statvfs(D).f_bsize, os.statvfs(D).f_namemax])
step("access", lambda: [os.access(D + "/f", m) for m in (os.R_OK, os.W_OK, os.X_OK)])
step("fsyncdir", lambda: fsyncdir(D))
step("rmdir non-empty", lambda: os.rmdir(D))
step("unlink a dir", lambda: os.unlink(D))
step("rmdir a file", lambda: os.rmdir(D + "/f"))
step("control area", lambda: os.open(".smithfs/made-up", os.O_CREAT | os.O_WRONLY, 0o644))
step("config.json", lambda: read_all("config.json"))
for n in ["f", "f3", "g", "l", "p", "c"]:
    step("unlink " + n, lambda n=n: os.unlink(D + "/" + n) or "ok")
step("unlink missing", lambda: os.unlink(D + "/f"))
step("rmdir", lambda: os.rmdir(D) or "ok")
for s in out:
    print(json.dumps(s))
"#;

/// The issue's test (docs/PROTOCOL-NOTES.md U14): the same operations through both local
/// framings, `/dev/fuse` and io_uring, each served by the one dispatcher, answer alike — every
/// errno, attribute, byte of data, listing and xattr.
#[test]
fn every_operation_answers_alike_over_dev_fuse_and_io_uring() {
    let Some(uring) = uring_mount() else { return };
    let dev = TestMount::with(MountOpts {
        allow_other: true,
        extra: vec!["--transport", "dev-fuse"],
        ..MountOpts::default()
    });
    let on = |m: &TestMount| {
        let root = m.path().to_string_lossy().into_owned();
        m.py_ok(EVERY_OPERATION, &[&root])
    };
    assert_eq!(uring_threads(dev.daemon_pid().expect("daemon")), 0);
    assert!(uring_threads(uring.daemon_pid().expect("daemon")) > 0);
    let (a, b) = (on(&dev), on(&uring));
    assert!(a.lines().count() > 40, "{a}");
    for (x, y) in a.lines().zip(b.lines()) {
        assert_eq!(
            x, y,
            "/dev/fuse (left) and io_uring (right) answered differently"
        );
    }
    assert_eq!(a, b);
}
