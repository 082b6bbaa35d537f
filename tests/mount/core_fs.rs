//! Real mounts driven by real processes: every operation of the core filesystem (issue 2), the
//! hidden state directory, the store after unmount, and the mount/umount CLI's refusals (double
//! mount, dead mount). Each test has its own `TestMount`, unmounted by its guard.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

/// Python helpers for calls the standard library does not wrap (errno-returning).
const PY: &str = r#"
import ctypes, errno, os, sys, fcntl, stat
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD = -100
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2
UTIME_NOW, UTIME_OMIT = (1 << 30) - 1, (1 << 30) - 2
def renameat2(a, b, flags):
    r = libc.renameat2(AT_FDCWD, a.encode(), AT_FDCWD, b.encode(), ctypes.c_uint(flags))
    return 0 if r == 0 else errno.errorcode[ctypes.get_errno()]
class timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]
def utimensat(path, a, m):
    ts = (timespec * 2)(timespec(*a), timespec(*m))
    r = libc.utimensat(AT_FDCWD, path.encode(), ts, 0)
    return 0 if r == 0 else errno.errorcode[ctypes.get_errno()]
def err(f, *args, **kw):
    try:
        f(*args, **kw)
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
"#;

fn py(m: &TestMount, body: &str) -> String {
    m.py_ok(&format!("{PY}\n{body}"), &[])
}

#[test]
fn lookup_getattr_and_enoent() {
    let m = TestMount::new();
    m.sh_ok("mkdir -p a/b/c && echo hello > a/b/c/f");
    assert_eq!(m.sh_ok("cat a/b/c/f"), "hello\n");
    assert_eq!(m.sh_ok("stat -c '%F %s' a/b/c/f"), "regular file 6\n");
    assert_eq!(m.sh_ok("stat -c %F a/b"), "directory\n");
    let out = py(
        &m,
        r#"
print(err(os.stat, "a/nope"), err(os.stat, "a/b/c/f/x"), err(os.open, "a", os.O_WRONLY))
"#,
    );
    assert_eq!(out.trim(), "ENOENT ENOTDIR EISDIR");
    // The init layout is visible through the mount.
    assert!(m.path().join("config.json").is_file());
    assert!(m.path().join("smiths/smith-root/smith.md").is_file());
}

#[test]
fn inode_numbers_are_stable_and_shared_by_hard_links() {
    let mut m = TestMount::new();
    m.sh_ok("echo x > f && ln f g && mkdir d && ln f d/h");
    let ino = m.sh_ok("stat -c %i f");
    assert_eq!(m.sh_ok("stat -c %i g"), ino);
    assert_eq!(m.sh_ok("stat -c %i d/h"), ino);
    assert_eq!(m.sh_ok("stat -c %h f"), "3\n");
    // The same number after the kernel forgot it and after a remount …
    m.sh_ok("echo 2 > /proc/sys/vm/drop_caches");
    assert_eq!(m.sh_ok("stat -c %i f"), ino);
    m.remount();
    assert_eq!(m.sh_ok("stat -c %i g"), ino);
    // … and it is the backing store's own inode number.
    m.umount();
    let backing = std::fs::metadata(m.path().join("f")).unwrap().ino();
    assert_eq!(backing.to_string(), ino.trim());
    m.mount();
}

#[test]
fn setattr_chmod_chown_truncate_times() {
    let m = TestMount::new();
    m.sh_ok("echo 0123456789 > f && chmod 640 f && chown 1234:5678 f");
    assert_eq!(m.sh_ok("stat -c '%a %u %g' f"), "640 1234 5678\n");
    m.sh_ok("chmod u+s,g+s,o+t f && truncate -s 3 f");
    assert_eq!(m.sh_ok("stat -c '%s' f && cat f"), "3\n012");
    m.sh_ok("truncate -s 100000 f");
    assert_eq!(m.sh_ok("stat -c %s f"), "100000\n");
    m.sh_ok("touch -d '2001-02-03 04:05:06.789 UTC' f");
    assert_eq!(
        m.sh_ok("TZ=UTC stat -c '%x|%y' f"),
        "2001-02-03 04:05:06.789000000 +0000|2001-02-03 04:05:06.789000000 +0000\n"
    );
    // touch -a / -m change one time only (UTIME_OMIT for the other).
    m.sh_ok("touch -m -d '@1000000000' f");
    assert_eq!(m.sh_ok("stat -c '%X %Y' f"), "981173106 1000000000\n");
    m.sh_ok("touch -a -d '@1100000000' f");
    assert_eq!(m.sh_ok("stat -c '%X %Y' f"), "1100000000 1000000000\n");
    // The raw syscall: nanoseconds, UTIME_OMIT and UTIME_NOW.
    let out = py(
        &m,
        r#"
import time
os.utime("f", ns=(1_500_000_000_123_456_789, 1_600_000_000_987_654_321))
s = os.stat("f"); print(s.st_atime_ns, s.st_mtime_ns)
print(utimensat("f", (7, UTIME_OMIT), (2_000_000_000, 5)))
s = os.stat("f"); print(s.st_atime_ns, s.st_mtime_ns)
print(utimensat("f", (0, UTIME_NOW), (0, UTIME_OMIT)))
s = os.stat("f"); print(abs(s.st_atime_ns - time.time_ns()) < 10**10, s.st_mtime_ns)
os.truncate("f", 0)
print(os.stat("f").st_size)
"#,
    );
    assert_eq!(
        out,
        "1500000000123456789 1600000000987654321\n0\n1500000000123456789 2000000000000000005\n0\nTrue 2000000000000000005\n0\n"
    );
    // chown of a directory and a symlink (lchown).
    m.sh_ok("mkdir d && chown 42:43 d && ln -s f l && chown -h 44:45 l");
    assert_eq!(
        m.sh_ok("stat -c '%u:%g' d l f"),
        "42:43\n44:45\n1234:5678\n"
    );
}

#[test]
fn symlink_readlink() {
    let m = TestMount::new();
    m.sh_ok("echo data > target && ln -s target rel && ln -s /etc/hostname abs && ln -s nowhere dangling");
    assert_eq!(
        m.sh_ok("readlink rel abs dangling"),
        "target\n/etc/hostname\nnowhere\n"
    );
    assert_eq!(m.sh_ok("cat rel"), "data\n");
    assert_eq!(m.sh_ok("stat -c %F rel"), "symbolic link\n");
    let long = "x".repeat(1000);
    m.sh_ok(&format!("ln -s {long} longlink"));
    assert_eq!(m.sh_ok("readlink longlink").trim(), long);
    let out = py(
        &m,
        r#"print(err(os.stat, "dangling"), err(os.readlink, "target"))"#,
    );
    assert_eq!(out.trim(), "ENOENT EINVAL");
    // A symlink pointing out of the mount is followed by the caller, like anywhere else.
    assert_eq!(
        m.sh_ok("cat abs"),
        std::fs::read_to_string("/etc/hostname").unwrap()
    );
}

#[test]
fn mknod_fifo_and_device() {
    let m = TestMount::new();
    m.sh_ok("mkfifo -m 600 fifo && mknod -m 640 null c 1 3 && mknod blk b 7 0");
    assert_eq!(
        m.sh_ok("stat -c '%F %a' fifo null"),
        "fifo 600\ncharacter special file 640\n"
    );
    assert_eq!(m.sh_ok("stat -c '%t:%T' null blk"), "1:3\n7:0\n");
    // Data flows through the fifo between two processes.
    assert_eq!(m.sh_ok("(echo through > fifo &) ; cat fifo"), "through\n");
    // The mount is nodev: a device node cannot be opened through it.
    let r = m.sh("head -c1 null");
    assert!(!r.ok());
    // Python's os.mknod for a socket type, then unlink.
    let out = py(
        &m,
        r#"
os.mknod("sock", 0o600 | stat.S_IFSOCK)
print(stat.S_ISSOCK(os.lstat("sock").st_mode)); os.unlink("sock"); print(err(os.lstat, "sock"))
"#,
    );
    assert_eq!(out, "True\nENOENT\n");
}

#[test]
fn mkdir_rmdir_unlink() {
    let m = TestMount::new();
    m.sh_ok("mkdir -m 750 d && mkdir -p d/e/f && touch d/file");
    assert_eq!(m.sh_ok("stat -c '%a %h' d"), "750 3\n");
    let out = py(
        &m,
        r#"
print(err(os.rmdir, "d"), err(os.mkdir, "d"), err(os.unlink, "d"), err(os.rmdir, "d/file"))
print(err(os.unlink, "d/nope"), err(os.rmdir, "d/e/f"), err(os.rmdir, "d/e"), err(os.unlink, "d/file"))
print(err(os.rmdir, "d"), err(os.stat, "d"))
"#,
    );
    assert_eq!(
        out,
        "ENOTEMPTY EEXIST EISDIR ENOTDIR\nENOENT ok ok ok\nok ENOENT\n"
    );
    // Unlinking an open file keeps its data readable through the descriptor.
    let out = py(
        &m,
        r#"
fd = os.open("open-unlinked", os.O_CREAT | os.O_RDWR, 0o644)
os.write(fd, b"still here")
os.unlink("open-unlinked")
print(err(os.stat, "open-unlinked"), os.pread(fd, 100, 0).decode(), os.fstat(fd).st_nlink)
os.close(fd)
"#,
    );
    assert_eq!(out, "ENOENT still here 0\n");
}

#[test]
fn rename_plain_noreplace_exchange() {
    let m = TestMount::new();
    m.sh_ok("echo a > a && echo b > b && mkdir d1 d2 && echo in > d1/x && touch d2/y");
    let out = py(
        &m,
        r#"
print(renameat2("a", "b", RENAME_NOREPLACE), open("a").read().strip(), open("b").read().strip())
print(renameat2("a", "b", RENAME_EXCHANGE), open("a").read().strip(), open("b").read().strip())
print(renameat2("a", "nope", RENAME_EXCHANGE), renameat2("a", "c", RENAME_NOREPLACE), err(os.stat, "a"))
print(renameat2("d1", "d2", RENAME_EXCHANGE), sorted(os.listdir("d1")), sorted(os.listdir("d2")))
print(renameat2("d1", "b", RENAME_EXCHANGE), stat.S_ISDIR(os.stat("b").st_mode), os.path.isfile("d1"))
print(renameat2("c", "d2", RENAME_NOREPLACE), renameat2("c", "d2", 0), renameat2("d2", "c", 0))
print(renameat2("b", "d1", 0))
os.mkdir("e"); os.mkdir("f"); open("f/z", "w").close()
print(renameat2("e", "f", 0), renameat2("f", "f/sub", 0), renameat2("e", "f", 0) if False else "")
print(renameat2("f/z", "z", 0), renameat2("e", "f", 0), os.path.isdir("f"), os.path.exists("e"))
"#,
    );
    assert_eq!(
        out,
        "EEXIST a b\n\
         0 b a\n\
         ENOENT 0 ENOENT\n\
         0 ['y'] ['x']\n\
         0 True True\n\
         EEXIST EISDIR ENOTDIR\n\
         ENOTDIR\n\
         ENOTEMPTY EINVAL \n\
         0 0 True False\n"
    );
    // mv across directories keeps the inode and content.
    let ino = m.sh_ok("stat -c %i c");
    m.sh_ok("mkdir -p deep/er && mv c deep/er/c2");
    assert_eq!(m.sh_ok("stat -c %i deep/er/c2"), ino);
    assert_eq!(m.sh_ok("cat deep/er/c2"), "b\n");
}

#[test]
fn hard_link() {
    let m = TestMount::new();
    m.sh_ok("echo one > f && ln f g && echo two >> g && mkdir d");
    assert_eq!(m.sh_ok("cat f"), "one\ntwo\n");
    assert_eq!(m.sh_ok("stat -c %h f"), "2\n");
    m.sh_ok("rm f");
    assert_eq!(m.sh_ok("stat -c %h g && cat g"), "1\none\ntwo\n");
    let out = py(
        &m,
        r#"print(err(os.link, "g", "d"), err(os.link, "d", "d2"), err(os.link, "nope", "x"))"#,
    );
    assert_eq!(out.trim(), "EEXIST EPERM ENOENT");
}

#[test]
fn open_create_read_write_fsync_append_trunc() {
    let m = TestMount::new();
    let out = py(
        &m,
        r#"
fd = os.open("f", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
print(stat.S_IMODE(os.fstat(fd).st_mode) == 0o600)
os.write(fd, b"hello world")
os.fsync(fd); os.fdatasync(fd)
os.pwrite(fd, b"W", 6)
print(os.pread(fd, 100, 0))
os.close(fd)
print(err(os.open, "f", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))
fd = os.open("f", os.O_WRONLY | os.O_APPEND)
os.lseek(fd, 0, os.SEEK_SET)
os.write(fd, b"!")
os.close(fd)
print(open("f", "rb").read())
fd = os.open("f", os.O_RDWR | os.O_TRUNC)
print(os.fstat(fd).st_size, os.read(fd, 10))
os.write(fd, b"x" * 200000)
os.close(fd)
with open("f", "rb") as f:
    print(len(f.read()))
# Many appenders through separate descriptors interleave whole writes.
fds = [os.open("log", os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644) for _ in range(4)]
for i in range(100):
    os.write(fds[i % 4], b"%03d\n" % i)
for f in fds: os.close(f)
print(open("log").read().split() == ["%03d" % i for i in range(100)])
# fsync on a directory (fsyncdir).
dfd = os.open(".", os.O_RDONLY | os.O_DIRECTORY); os.fsync(dfd); os.close(dfd)
print(os.access("f", os.R_OK | os.W_OK), os.access("f", os.X_OK), err(os.open, "nope", os.O_RDONLY))
"#,
    );
    assert_eq!(
        out,
        "True\nb'hello World'\nEEXIST\nb'hello World!'\n0 b''\n200000\nTrue\nTrue False ENOENT\n"
    );
    // A large file with a shell pipeline: content round-trips byte for byte.
    m.sh_ok("head -c 3000000 /dev/urandom > ../big && cp ../big big && cmp ../big big");
}

#[test]
fn readdir_5000_entries_and_seekdir() {
    let m = TestMount::new();
    m.sh_ok("mkdir big && cd big && seq -f 'entry-%05g' 0 4999 | xargs touch");
    assert_eq!(m.sh_ok("ls big | wc -l").trim(), "5000");
    assert_eq!(m.sh_ok("ls -f big | sort | uniq -d | wc -l").trim(), "0");
    let out = py(
        &m,
        r#"
names = [e.name for e in os.scandir("big")]
print(len(names), len(set(names)), sorted(names) == ["entry-%05d" % i for i in range(5000)])
"#,
    );
    assert_eq!(out, "5000 5000 True\n");

    // telldir/seekdir: resume from recorded offsets and see the same names (libc directly).
    let dir =
        std::ffi::CString::new(m.path().join("big").into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: plain libc directory-stream calls on a stream this block owns and closes.
    unsafe {
        let d = libc::opendir(dir.as_ptr());
        assert!(!d.is_null());
        let mut seen = Vec::new(); // (offset before the entry, name)
        loop {
            let pos = libc::telldir(d);
            let e = libc::readdir(d);
            if e.is_null() {
                break;
            }
            let name = std::ffi::CStr::from_ptr((*e).d_name.as_ptr())
                .to_string_lossy()
                .into_owned();
            seen.push((pos, name));
        }
        assert_eq!(seen.len(), 5002); // plus . and ..
        for &i in &[0usize, 1, 2, 1000, 2500, 4999, 5001, 17, 3333] {
            libc::seekdir(d, seen[i].0);
            let e = libc::readdir(d);
            assert!(!e.is_null(), "readdir after seekdir to entry {i}");
            let name = std::ffi::CStr::from_ptr((*e).d_name.as_ptr()).to_string_lossy();
            assert_eq!(name, seen[i].1, "seekdir to entry {i}");
        }
        libc::rewinddir(d);
        let e = libc::readdir(d);
        assert_eq!(
            std::ffi::CStr::from_ptr((*e).d_name.as_ptr()).to_string_lossy(),
            seen[0].1
        );
        libc::closedir(d);
    }

    // Deleting while iterating: every name that is not deleted is still seen exactly once.
    let out = py(
        &m,
        r#"
seen = []
with os.scandir("big") as it:
    for i, e in enumerate(it):
        seen.append(e.name)
        if i == 100:
            for j in range(0, 5000, 2):
                n = "big/entry-%05d" % j
                if n[4:] not in seen: os.unlink(n)
odd = ["entry-%05d" % i for i in range(1, 5000, 2)]
print(len(seen) == len(set(seen)), all(n in set(seen) for n in odd), len(os.listdir("big")))
"#,
    );
    assert_eq!(
        out.trim().split(' ').take(2).collect::<Vec<_>>(),
        ["True", "True"]
    );
}

#[test]
fn statfs_df() {
    let m = TestMount::new();
    let out = m.sh_ok("df -P . | tail -1");
    assert!(out.starts_with("smithfs"), "df: {out}");
    let fields: Vec<&str> = out.split_whitespace().collect();
    let blocks: u64 = fields[1].parse().unwrap();
    assert!(blocks > 0, "df: {out}");
    assert_eq!(m.sh_ok("stat -f -c %T ."), "fuseblk\n");
    let out = py(
        &m,
        r#"
a = os.statvfs("."); b = os.statvfs("..")
print(a.f_blocks == b.f_blocks, a.f_bsize == b.f_bsize, a.f_namemax)
"#,
    );
    assert_eq!(out, "True True 255\n");
}

#[test]
fn xattrs() {
    let m = TestMount::new();
    m.sh_ok("touch f && mkdir d && ln -s f l");
    let out = py(
        &m,
        r#"
os.setxattr("f", "user.a", b"1")
os.setxattr("f", "user.b", b"\x00binary\xff" * 100)
os.setxattr("d", "user.dir", b"on a dir")
print(sorted(os.listxattr("f")), os.getxattr("f", "user.a"), len(os.getxattr("f", "user.b")))
print(os.getxattr("d", "user.dir"))
print(err(os.setxattr, "f", "user.a", b"2", os.XATTR_CREATE), err(os.setxattr, "f", "user.c", b"2", os.XATTR_REPLACE))
os.setxattr("f", "user.a", b"22", os.XATTR_REPLACE)
print(os.getxattr("f", "user.a"))
os.removexattr("f", "user.a")
print(err(os.getxattr, "f", "user.a"), err(os.removexattr, "f", "user.a"), os.listxattr("f"))
print(err(os.setxattr, "l", "user.x", b"v", 0, follow_symlinks=False))
os.setxattr("f", "trusted.t", b"root only")
print(os.getxattr("f", "trusted.t"), err(os.setxattr, "f", "bogus.ns", b"v"))
os.setxattr("f", "user.empty", b"")
print(os.getxattr("f", "user.empty"))
"#,
    );
    assert_eq!(
        out,
        "['user.a', 'user.b'] b'1' 800\n\
         b'on a dir'\n\
         EEXIST ENODATA\n\
         b'22'\n\
         ENODATA ENODATA ['user.b']\n\
         EPERM\n\
         b'root only' ENOTSUP\n\
         b''\n"
    );
    // Xattrs are in the backing store after unmount.
    let mut m = m;
    m.umount();
    let out = py_in(
        m.path(),
        r#"import os; print(sorted(os.listxattr("f")), os.getxattr("d", "user.dir"))"#,
        &[],
    )
    .expect_ok("xattrs in the store");
    assert_eq!(out, "['trusted.t', 'user.b', 'user.empty'] b'on a dir'\n");
    m.mount();
}

#[test]
fn fallocate_seek_data_hole_copy_file_range() {
    let m = TestMount::new();
    m.sh_ok("fallocate -l 1M f && fallocate -n -o 1M -l 1M f");
    assert_eq!(m.sh_ok("stat -c %s f"), "1048576\n");
    assert!(
        m.sh_ok("stat -c %b f").trim().parse::<u64>().unwrap() * 512 >= 2 << 20,
        "fallocate -n must still allocate blocks"
    );
    let out = py(
        &m,
        r#"
fd = os.open("sparse", os.O_CREAT | os.O_RDWR, 0o644)
os.pwrite(fd, b"a" * 4096, 0)
os.pwrite(fd, b"b" * 4096, 8 << 20)
print(os.lseek(fd, 0, os.SEEK_DATA), os.lseek(fd, 0, os.SEEK_HOLE))
print(os.lseek(fd, 4096, os.SEEK_DATA), os.lseek(fd, 8 << 20, os.SEEK_HOLE))
print(err(os.lseek, fd, (8 << 20) + 4096, os.SEEK_DATA))
print(os.lseek(fd, 100, os.SEEK_SET), os.lseek(fd, 0, os.SEEK_END))
os.posix_fallocate(fd, 0, 16 << 20)
print(os.fstat(fd).st_size)
os.close(fd)
src = os.open("src", os.O_CREAT | os.O_RDWR, 0o644)
os.write(src, bytes(range(256)) * 1000)
dst = os.open("dst", os.O_CREAT | os.O_RDWR, 0o644)
n = os.copy_file_range(src, dst, 1000, 10, 20)
print(n, os.pread(dst, 2000, 0) == b"\0" * 20 + (bytes(range(256)) * 1000)[10:1010])
os.close(src); os.close(dst)
"#,
    );
    assert_eq!(
        out,
        "0 4096\n8388608 8392704\nENXIO\n100 8392704\n16777216\n1000 True\n"
    );
}

/// Start a python process that takes a lock on `file`, prints "locked" and holds it until its
/// stdin closes.
fn lock_holder(m: &TestMount, how: &str) -> std::process::Child {
    let code = format!(
        "import fcntl, sys\nf = open('{}', 'r+')\n{how}\nprint('locked', flush=True)\nsys.stdin.read()\n",
        "lockfile"
    );
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(code)
        .current_dir(m.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "locked\n");
    child
}

#[test]
fn flock_and_posix_locks_contend_between_processes() {
    let m = TestMount::new();
    m.sh_ok("echo data > lockfile");
    let try_lock = |how: &str| -> String {
        m.py_ok(
            &format!(
                "import fcntl, errno\nf = open('lockfile', 'r+')\ntry:\n    {how}\n    print('got')\nexcept OSError as e:\n    print(errno.errorcode[e.errno])\n"
            ),
            &[],
        )
    };
    for (hold, probe) in [
        (
            "fcntl.flock(f, fcntl.LOCK_EX)",
            "fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)",
        ),
        (
            "fcntl.lockf(f, fcntl.LOCK_EX)",
            "fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)",
        ),
        (
            "fcntl.lockf(f, fcntl.LOCK_SH, 10, 0)",
            "fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 5, 5)",
        ),
    ] {
        let mut holder = lock_holder(&m, hold);
        let r = try_lock(probe);
        assert!(
            r == "EAGAIN\n" || r == "EACCES\n" || r == "EWOULDBLOCK\n",
            "{probe} while another process holds {hold}: {r}"
        );
        // Releasing (the holder exits) lets the other process in.
        drop(holder.stdin.take());
        holder.wait().unwrap();
        assert_eq!(try_lock(probe), "got\n", "{probe} after release");
    }
    // Non-overlapping byte ranges do not contend; shared flocks do not contend.
    let mut holder = lock_holder(&m, "fcntl.lockf(f, fcntl.LOCK_EX, 10, 0)");
    assert_eq!(
        try_lock("fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 10)"),
        "got\n"
    );
    // F_GETLK reports the holder.
    let out = m.py_ok(
        r#"
import fcntl, struct, os
f = open('lockfile', 'r+')
lk = struct.pack('hhqqi', fcntl.F_WRLCK, 0, 0, 5, 0)
r = fcntl.fcntl(f, fcntl.F_GETLK, lk)
t, w, start, ln, pid = struct.unpack('hhqqi', r)
print(t == fcntl.F_WRLCK, start, ln, pid)
"#,
        &[],
    );
    assert_eq!(out, format!("True 0 10 {}\n", holder.id()));
    drop(holder.stdin.take());
    holder.wait().unwrap();
    let mut holder = lock_holder(&m, "fcntl.flock(f, fcntl.LOCK_SH)");
    assert_eq!(
        try_lock("fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)"),
        "got\n"
    );
    drop(holder.stdin.take());
    holder.wait().unwrap();
}

#[test]
fn files_created_by_another_user_belong_to_that_user() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let mut m = TestMount::new();
    // With the sandbox on, only the agents' user is the Operator besides root (docs/SPEC.md §2):
    // nobody is made that user here.
    m.set_sandbox(serde_json::json!({"uid": 65534}));
    m.sh_ok("mkdir -m 1777 pub && mkdir -m 2777 sgid && chgrp 4321 sgid");
    let r = sh_as(
        65534,
        65534,
        m.path(),
        "cd pub && echo hi > f && mkdir d && ln -s f l && mkfifo p && ln f h && \
         python3 -c 'import os; os.close(os.open(\"o\", os.O_CREAT|os.O_WRONLY, 0o600))' && \
         touch ../sgid/g && mkdir ../sgid/gd && stat -c '%n %u:%g' f d l p h o ../sgid/g ../sgid/gd",
    );
    let out = r.expect_ok("create as nobody");
    assert_eq!(
        out,
        "f 65534:65534\nd 65534:65534\nl 65534:65534\np 65534:65534\nh 65534:65534\no 65534:65534\n\
         ../sgid/g 65534:4321\n../sgid/gd 65534:4321\n"
    );
    assert_eq!(m.sh_ok("stat -c %a sgid/gd"), "2755\n");
    // And in the backing store, too.
    let mut m = m;
    m.umount();
    let md = std::fs::metadata(m.path().join("pub/f")).unwrap();
    assert_eq!((md.uid(), md.gid()), (65534, 65534));
    m.mount();
    // default_permissions: nobody cannot write root's 0644 file nor read a 0600 one.
    m.sh_ok("echo secret > secret && chmod 600 secret && echo pub > pubfile");
    let r = sh_as(65534, 65534, m.path(), "cat secret");
    assert!(!r.ok() && r.stderr.contains("Permission denied"), "{r:?}");
    let r = sh_as(65534, 65534, m.path(), "echo x >> pubfile");
    assert!(!r.ok() && r.stderr.contains("Permission denied"), "{r:?}");
    let r = sh_as(65534, 65534, m.path(), "rm -f pub/../pubfile");
    assert!(!r.ok(), "{r:?}");
    assert_eq!(
        sh_as(65534, 65534, m.path(), "cat pubfile").expect_ok("read"),
        "pub\n"
    );
    // The sticky bit: nobody cannot remove root's file in /pub.
    m.sh_ok("touch pub/roots");
    assert!(!sh_as(65534, 65534, m.path(), "rm -f pub/roots").ok());
}

#[test]
fn state_dir_is_invisible_and_cannot_be_created() {
    let m = TestMount::new();
    let out = py(
        &m,
        r#"
n = ".smithfs-state"
print(n in os.listdir("."), err(os.stat, n), err(os.lstat, n + "/daemon.log"))
print(err(os.mkdir, n), err(os.open, n, os.O_CREAT | os.O_WRONLY, 0o644), err(os.symlink, "x", n))
open("x", "w").close(); os.mkdir("xd")
print(err(os.link, "x", n), err(os.rename, "x", n), err(os.rename, "xd", n), err(os.mknod, n))
print(err(os.rmdir, n), err(os.unlink, n), err(os.rename, n, "y"), err(os.chmod, n, 0o777))
print(err(os.getxattr, n, "user.x"), renameat2("x", n, RENAME_EXCHANGE))
"#,
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "False ENOENT ENOENT");
    for l in &lines[1..4] {
        assert!(
            !l.contains("ok"),
            "an operation on .smithfs-state succeeded: {out}"
        );
    }
    assert!(!lines[4].ends_with(" 0"), "{out}");
    assert!(!lines[4].contains("ok"), "{out}");
    // Each refusal is a denial with its reason in `why` (docs/SPEC.md §3).
    let why = m.sh_ok("mkdir .smithfs-state 2>/dev/null || cat .smithfs/why");
    assert!(
        why.contains("reserved-name") && why.contains("mkdir"),
        "{why}"
    );
    let why = m.sh_ok("(echo x > .smithfs/whoami) 2>/dev/null || cat .smithfs/why");
    assert!(why.contains("control-read-only"), "{why}");
    let why = m.sh_ok("touch .smithfs/new 2>/dev/null || cat .smithfs/why");
    assert!(why.contains("reserved-name"), "{why}");
    // Only at the root: elsewhere it is an ordinary name.
    m.sh_ok("mkdir sub && mkdir sub/.smithfs-state && ls -a sub | grep -q smithfs-state");
    // The real one still holds only the daemon's files.
    let mut m = m;
    m.umount();
    let state = m.path().join(".smithfs-state");
    assert!(state.is_dir());
    assert!(!state.join("x").exists() && !state.join("xd").exists());
    m.mount();
}

#[test]
fn store_after_umount_holds_exactly_what_was_written() {
    let mut m = TestMount::new();
    m.sh_ok(
        "mkdir -p w/x/y && echo one > w/one && printf 'two' > w/x/two && ln -s ../one w/x/l && \
         ln w/one w/hard && chmod 600 w/x/two && rm -rf smiths/smith-root/private && \
         mv config.json config.moved && head -c 70000 /dev/urandom > w/x/y/rand && truncate -s 5 w/one",
    );
    let through_mount = store_view(m.path());
    assert!(through_mount.contains_key("w/x/y/rand"));
    m.umount();
    assert!(m.path().join(".smithfs-state").is_dir());
    assert!(
        !m.path().join(".smithfs").exists(),
        "the control dir is virtual"
    );
    assert_eq!(store_view(m.path()), through_mount);
    // The hard link is still a hard link underneath.
    let a = std::fs::metadata(m.path().join("w/one")).unwrap();
    let b = std::fs::metadata(m.path().join("w/hard")).unwrap();
    assert_eq!((a.ino(), a.nlink()), (b.ino(), 2));
    m.mount();
    assert_eq!(store_view(m.path()), through_mount);
}

#[test]
fn mounting_twice_is_refused() {
    let m = TestMount::new();
    let r = smithfs([std::ffi::OsStr::new("mount"), m.path().as_os_str()]);
    assert!(!r.ok());
    assert!(
        r.stderr.contains("already mounted") && r.stderr.contains("smithfs umount"),
        "{r:?}"
    );
    assert_eq!(r.stderr.trim().lines().count(), 1, "one line: {r:?}");
    // Still exactly one smithfs mount there, and it works.
    let n = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.split(' ').nth(4) == m.path().to_str())
        .count();
    assert_eq!(n, 1);
    m.sh_ok("touch still-works");
}

#[test]
fn bad_mount_targets_fail_with_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("missing");
    let r = smithfs([std::ffi::OsStr::new("mount"), missing.as_os_str()]);
    assert!(!r.ok() && r.stderr.trim().lines().count() == 1, "{r:?}");
    assert!(!missing.exists());
    let file = tmp.path().join("file");
    std::fs::write(&file, "x").unwrap();
    let r = smithfs([std::ffi::OsStr::new("mount"), file.as_os_str()]);
    assert!(!r.ok() && r.stderr.contains("not a directory"), "{r:?}");
    assert!(!is_smithfs_mounted(&file));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "x");
    let r = smithfs([std::ffi::OsStr::new("umount"), tmp.path().as_os_str()]);
    assert!(!r.ok() && r.stderr.contains("not mounted"), "{r:?}");
}

/// SIGKILL the daemon, then check the dead mount, the refusal and both ways of clearing it.
#[test]
fn dead_mount_gives_enotconn_and_is_cleared_by_umount() {
    let mut m = TestMount::new();
    m.sh_ok("echo survived > f");
    // A descriptor opened before the crash.
    let kill_daemon = |m: &TestMount| {
        let pid = m.daemon_pid().expect("daemon pid");
        // SAFETY: kill of the daemon this test started.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
        poll_until(Duration::from_secs(10), "the daemon to die", || {
            process_gone(pid)
        });
    };
    kill_daemon(&m);
    // Over io_uring the kernel tears the rings down just after the daemon's exit: a request
    // caught in that moment ends with ECONNABORTED or ECANCELED (docs/PROTOCOL-NOTES.md U3); then ENOTCONN.
    wait_enotconn(|| std::fs::metadata(m.path()).map(|_| ()));
    let err = std::fs::File::create(m.path().join("new")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTCONN), "{err}");
    assert!(is_smithfs_mounted(m.path()));

    let r = smithfs([std::ffi::OsStr::new("mount"), m.path().as_os_str()]);
    assert!(!r.ok(), "{r:?}");
    assert!(
        r.stderr.contains("smithfs umount") && r.stderr.contains("--force"),
        "{r:?}"
    );
    assert_eq!(r.stderr.trim().lines().count(), 1, "{r:?}");

    smithfs([std::ffi::OsStr::new("umount"), m.path().as_os_str()]).expect_ok("umount dead");
    assert!(!is_smithfs_mounted(m.path()));
    assert_eq!(
        std::fs::read_to_string(m.path().join("f")).unwrap(),
        "survived\n"
    );
    m.mount();
    assert_eq!(m.sh_ok("cat f"), "survived\n");

    // --force clears it too.
    kill_daemon(&m);
    smithfs([
        std::ffi::OsStr::new("mount"),
        m.path().as_os_str(),
        std::ffi::OsStr::new("--force"),
        std::ffi::OsStr::new("--allow-other"),
    ])
    .expect_ok("mount --force over a dead mount");
    assert_eq!(m.sh_ok("cat f"), "survived\n");
    let n = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.split(' ').nth(4) == m.path().to_str())
        .count();
    assert_eq!(n, 1, "the dead mount must be gone, not stacked under");
}

#[test]
fn foreground_mount_serves_and_sigterm_unmounts() {
    let mut m = TestMount::with(MountOpts {
        foreground: true,
        ..MountOpts::default()
    });
    m.sh_ok("echo fg > f && cat f");
    let pid = m.daemon_pid().unwrap();
    // SAFETY: SIGTERM to the child this test spawned.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    poll_until(Duration::from_secs(10), "SIGTERM to unmount", || {
        !is_smithfs_mounted(m.path())
    });
    let status = m.wait_foreground_exit();
    assert!(
        status.success(),
        "the server exits 0 after SIGTERM: {status}"
    );
    assert_eq!(std::fs::read_to_string(m.path().join("f")).unwrap(), "fg\n");
    // The guard copes with an already-unmounted mount; mount again to test remount in -f mode.
    m.mount();
    assert_eq!(m.sh_ok("cat f"), "fg\n");
}

#[test]
fn busy_umount_fails_clearly_and_keeps_mount() {
    let m = TestMount::new();
    let mut holder = Command::new("bash")
        .arg("-c")
        .arg("echo ready; read")
        .current_dir(m.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(holder.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let r = smithfs([std::ffi::OsStr::new("umount"), m.path().as_os_str()]);
    writeln!(holder.stdin.as_mut().unwrap()).unwrap();
    holder.wait().unwrap();
    assert!(!r.ok() && r.stderr.contains("busy"), "{r:?}");
    assert!(is_smithfs_mounted(m.path()));
    m.sh_ok("touch ok");
}

#[test]
fn descriptor_operations_after_unlink_and_rename() {
    let m = TestMount::new();
    let out = py(
        &m,
        r#"
fd = os.open("f", os.O_CREAT | os.O_RDWR, 0o644)
os.write(fd, b"0123456789")
os.rename("f", "g")
print(os.fstat(fd).st_size, os.path.exists("f"), open("g").read())
os.unlink("g")
os.ftruncate(fd, 4)
os.fchmod(fd, 0o600)
os.fchown(fd, 1234, 4321)
os.utime(fd, ns=(5, 6_000_000_007))
s = os.fstat(fd)
print(s.st_size, oct(s.st_mode & 0o777), s.st_uid, s.st_gid, s.st_mtime_ns, s.st_nlink)
os.pwrite(fd, b"XY", 2)
print(os.pread(fd, 100, 0))
os.fsync(fd)
os.setxattr(fd, "user.k", b"v"); print(os.getxattr(fd, "user.k"))
os.posix_fallocate(fd, 0, 8192); print(os.fstat(fd).st_size)
os.close(fd)
# A directory descriptor survives its directory's rename.
os.mkdir("d"); open("d/x", "w").close()
dfd = os.open("d", os.O_RDONLY | os.O_DIRECTORY)
os.rename("d", "e")
print(os.listdir(dfd), os.stat("x", dir_fd=dfd).st_size)
open("y", "w").close(); os.rename("y", "e/y")
print(sorted(os.listdir(dfd)))
os.close(dfd)
"#,
    );
    assert_eq!(
        out,
        "10 False 0123456789\n4 0o600 1234 4321 6000000007 0\nb'01XY'\nb'v'\n8192\n['x'] 0\n['x', 'y']\n"
    );
}

#[test]
fn concurrent_appenders_lose_no_line() {
    let m = TestMount::new();
    m.sh_ok(
        "for p in 1 2 3 4; do (for i in $(seq 1 300); do echo \"$p-$i-padding-padding-padding\" >> log; done) & done; wait",
    );
    assert_eq!(m.sh_ok("wc -l < log").trim(), "1200");
    assert_eq!(m.sh_ok("sort -u log | wc -l").trim(), "1200");
    assert_eq!(
        m.sh_ok("grep -cv '^[1-4]-[0-9]*-padding-padding-padding$' log || true")
            .trim(),
        "0"
    );
}

#[test]
fn parallel_processes_building_and_tearing_down_trees() {
    let m = TestMount::new();
    // Eight processes each create, rename into a shared directory, list, and delete.
    m.sh_ok(
        "mkdir shared && for p in $(seq 1 8); do ( \
           mkdir -p own$p/a/b && for i in $(seq 1 100); do echo $p$i > own$p/a/b/f$i; done && \
           for i in $(seq 1 100); do mv own$p/a/b/f$i shared/p$p-$i; done && \
           ls shared > /dev/null && rm -r own$p \
         ) & done; wait",
    );
    assert_eq!(m.sh_ok("ls shared | wc -l").trim(), "800");
    assert_eq!(
        m.sh_ok("find . -maxdepth 1 -name 'own*' | wc -l").trim(),
        "0"
    );
    assert_eq!(m.sh_ok("cat shared/p3-42"), "342\n");
    m.sh_ok(
        "for p in $(seq 1 8); do (rm shared/p$p-*) & done; wait; test -z \"$(ls -A shared)\" && rmdir shared",
    );
}

#[test]
fn programs_run_from_the_mount() {
    let m = TestMount::new();
    m.sh_ok("cp /bin/echo ./myecho && printf '#!/bin/sh\\necho script \"$@\"\\n' > s.sh && chmod +x s.sh");
    assert_eq!(m.sh_ok("./myecho elf works"), "elf works\n");
    assert_eq!(m.sh_ok("./s.sh ran"), "script ran\n");
    // A running binary cannot be opened for writing (ETXTBSY), as on any local filesystem.
    let out = m.sh_ok(
        "cp /bin/sleep ./mysleep && (./mysleep 30 & echo $! > pid) && \
         for i in $(seq 1 500); do grep -q mysleep /proc/$(cat pid)/cmdline 2>/dev/null && break; done; \
         python3 -c '
import errno, os
try:
    os.open(\"mysleep\", os.O_WRONLY); print(\"opened\")
except OSError as e:
    print(errno.errorcode[e.errno])
'; kill $(cat pid)",
    );
    assert_eq!(out, "ETXTBSY\n");
}

#[test]
fn shared_mmap_writes_reach_the_file() {
    let m = TestMount::new();
    let out = py(
        &m,
        r#"
import mmap
with open("mm", "wb") as f:
    f.write(b"\0" * 8192)
fd = os.open("mm", os.O_RDWR)
mp = mmap.mmap(fd, 8192, mmap.MAP_SHARED)
mp[100:105] = b"hello"
mp[5000:5003] = b"abc"
mp.flush()
import subprocess
other = subprocess.run(["python3", "-c", "d = open('mm','rb').read(); print(d[100:105], d[5000:5003])"], capture_output=True, text=True).stdout
print(other.strip())
os.pwrite(fd, b"WORLD", 100)
print(mp[100:105])
mp.close(); os.close(fd)
"#,
    );
    assert_eq!(out, "b'hello' b'abc'\nb'WORLD'\n");
}

/// Run the same script as nobody on a plain directory and in the mount; the outputs must match.
/// (nobody is made the agents' user first: with the sandbox on, another uid is Unknown, §2.)
fn same_as_plain_dir_as_nobody(m: &mut TestMount, setup_as_root: &str, script: &str) {
    m.set_sandbox(serde_json::json!({"uid": 65534}));
    let plain = m.scratch().join("plain");
    std::fs::create_dir(&plain).unwrap();
    std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::create_dir(m.path().join("plain")).unwrap();
    std::fs::set_permissions(
        m.path().join("plain"),
        std::fs::Permissions::from_mode(0o777),
    )
    .unwrap();
    sh_in(&plain, setup_as_root).expect_ok("setup on the plain dir");
    sh_in(&m.path().join("plain"), setup_as_root).expect_ok("setup in the mount");
    let want = sh_as(65534, 65534, &plain, script);
    let got = sh_as(65534, 65534, &m.path().join("plain"), script);
    assert!(want.ok(), "{want:?}");
    assert_eq!(got.stdout, want.stdout, "mount vs plain dir: {got:?}");
}

use std::os::unix::fs::PermissionsExt;

#[test]
fn truncates_and_chmods_by_others_clear_setuid_like_ext4() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let mut m = TestMount::new();
    same_as_plain_dir_as_nobody(
        &mut m,
        "for f in t a g; do echo data > $f; chmod 6777 $f; done; \
         echo d > o; chown 65534:65534 o; chmod 6755 o",
        "truncate -s 1 t; python3 -c 'import os; fd = os.open(\"a\", os.O_WRONLY); os.ftruncate(fd, 2)'; \
         chmod 6755 o; stat -c '%n %a' t a g o",
    );
}

/// A write by a process without CAP_FSETID clears setuid/setgid (ext4: `w 777`, `gx 767`).
const KILL_ON_WRITE: (&str, &str) = (
    "echo data > w; chmod 6777 w; echo d > gx; chmod 2767 gx; echo d > p; chmod 4777 p",
    "echo more >> w; echo x >> gx; python3 -c 'import os; fd = os.open(\"p\", os.O_WRONLY); os.pwrite(fd, b\"z\", 0)'; \
     stat -c '%n %a' w gx p",
);

#[test]
fn writes_by_others_clear_setuid_like_ext4() {
    let mut m = TestMount::new();
    same_as_plain_dir_as_nobody(&mut m, KILL_ON_WRITE.0, KILL_ON_WRITE.1);
}

#[test]
fn writes_by_others_clear_setuid_like_ext4_without_passthrough() {
    let mut m = TestMount::with(MountOpts {
        allow_other: true,
        extra: vec!["--no-passthrough"],
        ..MountOpts::default()
    });
    same_as_plain_dir_as_nobody(&mut m, KILL_ON_WRITE.0, KILL_ON_WRITE.1);
}

#[test]
fn nlink_and_ctime_are_fresh_after_each_change() {
    let m = TestMount::new();
    // Wait (bounded) until the filesystem clock has moved past `t`, so a later change must
    // show a newer ctime.
    let ctime = |p: &str| -> i128 {
        let md = std::fs::symlink_metadata(m.path().join(p)).unwrap();
        i128::from(md.ctime()) * 1_000_000_000 + i128::from(md.ctime_nsec())
    };
    let tick = |after: i128| {
        poll_until(Duration::from_secs(5), "the clock to tick", || {
            m.sh_ok("touch .clock");
            ctime(".clock") > after
        })
    };
    m.sh_ok("echo x > f && mkdir d");
    let mut last = ctime("f");
    for (step, script, nlink) in [
        ("link", "ln f g", "2"),
        ("link into a dir", "ln f d/h", "3"),
        ("chmod via another name", "chmod 600 d/h", "3"),
        ("rename", "mv g g2", "3"),
        ("unlink", "rm g2", "2"),
        ("write", "echo y >> d/h", "2"),
        (
            "xattr",
            "python3 -c 'import os; os.setxattr(\"f\", \"user.a\", b\"1\")'",
            "2",
        ),
    ] {
        tick(last);
        m.sh_ok(script);
        assert_eq!(
            m.sh_ok("stat -c %h f"),
            format!("{nlink}\n"),
            "nlink after {step}"
        );
        let now = ctime("f");
        assert!(now > last, "ctime did not change after {step}");
        last = now;
    }
    // A directory's nlink follows its subdirectories.
    m.sh_ok("mkdir d/s1 d/s2");
    assert_eq!(m.sh_ok("stat -c %h d"), "4\n");
    m.sh_ok("rmdir d/s1 && mv d/s2 s2");
    assert_eq!(m.sh_ok("stat -c %h d"), "2\n");
    assert_eq!(
        m.sh_ok("stat -c %h ."),
        m.sh_ok("ls -l -d . | awk '{print $2}'")
    );
}

/// An unmount not made by `smithfs umount` (plain `umount`, `fusermount3 -u`, SIGTERM to the
/// daemon) leaves the daemon exiting for a moment; a `smithfs mount` in that moment must still
/// succeed (or wait), not claim that another daemon is serving a directory that is not mounted.
#[test]
fn mount_right_after_an_external_umount_succeeds() {
    let m = TestMount::new();
    for i in 0..30 {
        run(Command::new("umount").arg(m.path())).expect_ok("umount");
        let r = smithfs([
            std::ffi::OsStr::new("mount"),
            m.path().as_os_str(),
            std::ffi::OsStr::new("--allow-other"),
        ]);
        assert!(r.ok(), "round {i}: {r:?}");
        assert!(
            !r.stderr.contains("warning"),
            "round {i}: the exiting daemon is reported as a user of the directory: {r:?}"
        );
    }
    m.sh_ok("touch still-works");
}

/// `smithfs umount` returns once the daemon is gone: an immediate `smithfs mount` succeeds and
/// warns about nobody.
#[test]
fn umount_then_mount_again_at_once() {
    let m = TestMount::new();
    for i in 0..30 {
        smithfs([std::ffi::OsStr::new("umount"), m.path().as_os_str()]).expect_ok("umount");
        let r = smithfs([
            std::ffi::OsStr::new("mount"),
            m.path().as_os_str(),
            std::ffi::OsStr::new("--allow-other"),
        ]);
        assert!(r.ok(), "round {i}: {r:?}");
        assert!(!r.stderr.contains("warning"), "round {i}: {r:?}");
    }
    m.sh_ok("touch still-works");
}

/// SIGTERM to the daemon unmounts cleanly (docs/SPEC.md §6): no dead mount is left, the daemon
/// exits, and `smithfs umount` (which now asks the daemon this way) is quick.
#[test]
fn sigterm_to_the_daemon_unmounts_cleanly_and_umount_is_quick() {
    let mut m = TestMount::new();
    m.sh_ok("echo kept > f");
    let pid = m.daemon_pid().expect("daemon");
    // SAFETY: SIGTERM to the daemon this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    poll_until(Duration::from_secs(10), "SIGTERM to unmount", || {
        let dead = matches!(
            std::fs::metadata(m.path()).map_err(|e| e.raw_os_error()),
            Err(Some(libc::ENOTCONN))
        );
        assert!(!dead, "SIGTERM killed the daemon and left a dead mount");
        !is_smithfs_mounted(m.path())
    });
    poll_until(Duration::from_secs(10), "the daemon to exit", || {
        process_gone(pid)
    });
    assert_eq!(
        std::fs::read_to_string(m.path().join("f")).unwrap(),
        "kept\n"
    );
    m.mount();
    let start = std::time::Instant::now();
    m.umount();
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "smithfs umount took {:?}",
        start.elapsed()
    );
}
