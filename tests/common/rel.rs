//! Helpers for `tests/reliability.rs` (issue 6): bound storm processes, killing the daemon,
//! checking the backing store after a crash, errno probes, and the long/short switch.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::*;

/// `SMITHFS_LONG=1` selects the long variants (minutes); CI runs the short ones.
pub fn long() -> bool {
    std::env::var("SMITHFS_LONG").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// A writer for the crash storm. argv: DIR LOG TAG [COUNT]. Writes files `TAG-NNNNNN` in DIR,
/// cycling through three ways of completing a write — (0) temp + fsync + rename, (1) write +
/// fsync + close, (2) write + close — and one file `TAG-append` grown by fsync'ed appends. After
/// each write completes (the close/fsync/rename returned) it appends a line to LOG (outside the
/// mount): `file NAME` or `append LEN`. Stops at the first error (the daemon died) or after
/// COUNT files.
pub const WRITER_PY: &str = r##"
import os, sys, hashlib
d, log, tag = sys.argv[1:4]
count = int(sys.argv[4]) if len(sys.argv) > 4 else 10**9
os.makedirs(d, exist_ok=True)
lf = open(log, "a", buffering=1)
def content(name):
    h = hashlib.sha256(name.encode()).digest()
    n = int.from_bytes(h[:2], "little") % 20000 + 1
    return (h * (n // 32 + 1))[:n]
def write_all(fd, b):
    while b:
        b = b[os.write(fd, b):]
app = os.open(f"{d}/{tag}-append", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
alen = os.fstat(app).st_size
i = 0
while i < count:
    i += 1
    name = f"{tag}-{i:06}"
    data = content(name)
    try:
        if os.path.exists(f"{d}/{name}"):
            continue
        mode = i % 3
        if mode == 0:
            tmp = f"{d}/.{name}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            write_all(fd, data); os.fsync(fd); os.close(fd)
            os.rename(tmp, f"{d}/{name}")
        else:
            fd = os.open(f"{d}/{name}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            write_all(fd, data)
            if mode == 1:
                os.fsync(fd)
            os.close(fd)
        lf.write(f"file {name}\n")
        if i % 5 == 0:
            chunk = content(f"{name}-a")[:500]
            write_all(app, chunk); os.fsync(app)
            alen += len(chunk)
            lf.write(f"append {alen}\n")
    except OSError as e:
        print(f"writer {tag}: stopped at {name}: {e}", flush=True)
        sys.exit(3)
"##;

/// Verify a writer's log against DIR. argv: DIR LOG TAG. Prints `ok FILES APPENDS` or the
/// problems, one per line, and exits non-zero on any.
pub const VERIFY_PY: &str = r##"
import os, sys, hashlib
d, log, tag = sys.argv[1:4]
def content(name):
    h = hashlib.sha256(name.encode()).digest()
    n = int.from_bytes(h[:2], "little") % 20000 + 1
    return (h * (n // 32 + 1))[:n]
bad = []
files = appends = 0
expect_app = b""
names = sorted(n for n in os.listdir(d) if n.startswith(tag + "-0"))
for n in names:
    pass
alen = 0
for line in open(log):
    kind, arg = line.split()
    if kind == "file":
        files += 1
        try:
            got = open(f"{d}/{arg}", "rb").read()
        except OSError as e:
            bad.append(f"{arg}: {e}"); continue
        if got != content(arg):
            bad.append(f"{arg}: {len(got)} bytes, want {len(content(arg))}, equal prefix {os.path.commonprefix([got, content(arg)]).__len__()}")
    else:
        appends += 1
        alen = int(arg)
try:
    have = os.path.getsize(f"{d}/{tag}-append")
except OSError:
    have = -1
if have < alen:
    bad.append(f"{tag}-append: {have} bytes, {alen} were fsynced")
for b in bad:
    print(b)
print(f"{'ok' if not bad else 'BAD'} {files} {appends}")
sys.exit(1 if bad else 0)
"##;

/// The publisher for the crash storm (bound as the root): version V of the result is written in
/// private/ and renamed onto outbox/result.md; each version is self-describing
/// (`# version V` … `END V`) so a torn copy is recognisable. Logs `V` after each rename returned.
pub const PUBLISHER_PY: &str = r##"
import os, sys
root, log = sys.argv[1:3]
lf = open(log, "a", buffering=1)
v = 0
while True:
    v += 1
    body = f"# version {v}\n" + "".join(f"line {v} {i} " + "x" * (v % 70) + "\n" for i in range(200 + v % 300)) + f"END {v}\n"
    try:
        tmp = f"{root}/private/result.{v}.tmp"
        with open(tmp, "w") as f:
            f.write(body)
        os.rename(tmp, f"{root}/outbox/result.md")
        lf.write(f"{v}\n")
    except OSError as e:
        print(f"publisher: stopped at {v}: {e}", flush=True)
        sys.exit(3)
"##;

/// Is `text` one whole version written by `PUBLISHER_PY`? Returns its number.
pub fn whole_version(text: &str) -> Option<u64> {
    let first = text.lines().next()?;
    let v: u64 = first.strip_prefix("# version ")?.parse().ok()?;
    let mut body = format!("# version {v}\n");
    for i in 0..(200 + v % 300) {
        body.push_str(&format!("line {v} {i} {}\n", "x".repeat((v % 70) as usize)));
    }
    body.push_str(&format!("END {v}\n"));
    (body == text).then_some(v)
}

/// The scaffolder for the crash storm (the operator): under each given smith dir, mkdir children
/// `smith-NNN` (next free number) until every parent below level 3 has 5 children, breadth
/// first. Logs each completed mkdir. Stops at the first unexpected error.
pub const SCAFFOLDER_PY: &str = r##"
import os, sys, errno, re
log = sys.argv[1]
roots = sys.argv[2:]
lf = open(log, "a", buffering=1)
queue = [(r, 1) for r in roots]
while queue:
    d, level = queue.pop(0)
    if level >= 3:
        continue
    kids = f"{d}/children"
    try:
        names = sorted(n for n in os.listdir(kids) if re.fullmatch(r"smith-\d{3,}", n))
        nums = [int(n[6:]) for n in names]
        while len(names) < 5:
            n = max(nums, default=0) + 1
            name = f"smith-{n:03}"
            try:
                os.mkdir(f"{kids}/{name}")
            except OSError as e:
                if e.errno == errno.EINVAL:   # a number used before a crash: skip it
                    nums.append(n); continue
                raise
            lf.write(f"{kids}/{name}\n")
            names.append(name); nums.append(n)
        queue.extend((f"{kids}/{n}", level + 1) for n in names)
    except OSError as e:
        print(f"scaffolder: stopped at {d}: {e}", flush=True)
        sys.exit(3)
print("scaffolder: tree complete", flush=True)
"##;

/// Spawn `smithfs run --mount DIR --smith ID -- CMD…`, output to `log`.
pub fn spawn_bound(mount: &Path, id: &str, cmd: &[&OsStr], log: &Path) -> Child {
    let out = std::fs::File::create(log).unwrap();
    Command::new(SMITHFS)
        .arg("run")
        .arg("--mount")
        .arg(mount)
        .arg("--smith")
        .arg(id)
        .arg("--")
        .args(cmd)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("spawn smithfs run")
}

/// `smithfs run --mount MOUNT --smith ID --` with the command still to be added (`.args(…)`).
pub fn bound_command(mount: impl AsRef<OsStr>, id: impl AsRef<OsStr>) -> Command {
    let mut c = Command::new(SMITHFS);
    c.arg("run")
        .arg("--mount")
        .arg(mount)
        .arg("--smith")
        .arg(id)
        .arg("--");
    c
}

/// Spawn an unbound (operator) process.
pub fn spawn_operator(cmd: &[&OsStr], log: &Path) -> Child {
    let out = std::fs::File::create(log).unwrap();
    Command::new(cmd[0])
        .args(&cmd[1..])
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("spawn")
}

/// Lines in a log file (0 if absent).
pub fn lines_in(p: &Path) -> usize {
    std::fs::read_to_string(p).map_or(0, |s| s.lines().count())
}

/// Wait (bounded) for a child to exit; kill it on timeout. Its exit code.
pub fn wait_child(c: &mut Child, limit: Duration) -> Option<i32> {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if let Ok(Some(st)) = c.try_wait() {
            return st.code();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = c.kill();
    let _ = c.wait();
    None
}

/// SIGKILL the daemon of `dir` (found like `pgrep -f "smithfs mount DIR"`); its pid.
pub fn kill_daemon(dir: &Path) -> i32 {
    let pid = find_daemon(dir).expect("the daemon of the mount");
    // SAFETY: kill of the daemon this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    poll_until(MOUNT_DEADLINE, "the killed daemon to be gone", || {
        process_gone(pid)
    });
    pid
}

/// The errno name of an `std::io::Error` (or "ok").
pub fn errno_of<T>(r: std::io::Result<T>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => match e.raw_os_error() {
            Some(libc::ENOTCONN) => "ENOTCONN".into(),
            Some(libc::ENOENT) => "ENOENT".into(),
            Some(libc::EACCES) => "EACCES".into(),
            Some(libc::EPERM) => "EPERM".into(),
            Some(libc::ENAMETOOLONG) => "ENAMETOOLONG".into(),
            Some(libc::EINVAL) => "EINVAL".into(),
            Some(libc::EEXIST) => "EEXIST".into(),
            Some(n) => format!("errno {n}"),
            None => e.to_string(),
        },
    }
}

/// Every regular file and dir under `root` whose name starts with one of `prefixes`
/// (relative paths), e.g. the scaffold's `.smithfs-new.` temp dirs.
pub fn find_names(root: &Path, prefixes: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let p = e.path();
            if prefixes.iter().any(|x| name.starts_with(x)) {
                out.push(p.strip_prefix(root).unwrap().display().to_string());
            }
            if e.file_type().is_ok_and(|t| t.is_dir()) && name != ".smithfs" {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Every `smith-NNN` directory in any `children/` below `root`, relative to `root`.
pub fn child_dirs(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.join("smiths/smith-root")];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(d.join("children")) else {
            continue;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("smith-") && e.file_type().is_ok_and(|t| t.is_dir()) {
                out.push(e.path().strip_prefix(root).unwrap().to_path_buf());
                stack.push(e.path());
            }
        }
    }
    out.sort();
    out
}

/// What a complete smith dir lacks (empty when complete): every area, smith.md,
/// private/START_HERE.md and the bundled skill.
pub fn missing_structure(smith_dir: &Path) -> Vec<&'static str> {
    [
        "inbox",
        "private",
        "outbox",
        "children",
        "conversations",
        "home",
        ".claude/skills",
        "smith.md",
        "private/START_HERE.md",
        ".claude/skills/agent-smith/SKILL.md",
    ]
    .into_iter()
    .filter(|p| !smith_dir.join(p).exists())
    .collect()
}

/// Check a journal (`.smithfs-state/events.jsonl` bytes): every complete line is a JSON
/// object; an unterminated last line is allowed. Returns (events, torn tail present).
pub fn check_journal(bytes: &[u8]) -> (Vec<serde_json::Value>, bool) {
    let text = String::from_utf8_lossy(bytes);
    let torn = !text.is_empty() && !text.ends_with('\n');
    let mut evs = Vec::new();
    let mut lines: Vec<&str> = text.split('\n').collect();
    lines.pop(); // after the last '\n': empty, or the torn tail
    for (i, l) in lines.iter().enumerate() {
        if l.is_empty() {
            continue;
        }
        match serde_json::from_str::<serde_json::Value>(l) {
            Ok(v) => evs.push(v),
            Err(e) => panic!("journal line {} is not JSON ({e}): {l:?}", i + 1),
        }
    }
    (evs, torn)
}

/// A journal with a crash's garbage allowed: lines that do not parse are counted, not fatal.
pub fn journal_events_lenient(bytes: &[u8]) -> (Vec<serde_json::Value>, usize) {
    let text = String::from_utf8_lossy(bytes);
    let mut evs = Vec::new();
    let mut bad = 0;
    for l in text.lines().filter(|l| !l.is_empty()) {
        match serde_json::from_str::<serde_json::Value>(l) {
            Ok(v) => evs.push(v),
            Err(_) => bad += 1,
        }
    }
    (evs, bad)
}

/// `smithfs mount DIR --allow-other EXTRA…` (for remounts with flags TestMount does not know).
pub fn mount_with(dir: &Path, extra: &[&str]) -> Run {
    let mut args: Vec<&OsStr> = vec![
        OsStr::new("mount"),
        dir.as_os_str(),
        OsStr::new("--allow-other"),
    ];
    args.extend(extra.iter().map(OsStr::new));
    smithfs(args)
}

/// Write `config.json` in the store (or through the mount as the operator).
pub fn write_config(dir: &Path, json: &serde_json::Value) {
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_vec_pretty(json).unwrap(),
    )
    .unwrap();
}

/// Threads, fds and RSS (kB) of a process.
pub fn proc_figures(pid: i32) -> (usize, usize, u64) {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    let threads = std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count());
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0);
    (fds, threads, rss)
}

/// The kernel stacks of every thread of `pid` (root only), for deadlock reports.
pub fn kernel_stacks(pid: i32) -> String {
    let mut out = String::new();
    if let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in rd.flatten() {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            let stack = std::fs::read_to_string(t.path().join("stack")).unwrap_or_default();
            out.push_str(&format!(
                "--- tid {} ({})\n{}",
                t.file_name().to_string_lossy(),
                comm.trim(),
                stack
            ));
        }
    }
    out
}

/// The rename/link/unlink storm of one worker (argv: BASE ROLE SEED COUNT MODE), run
/// concurrently by the root smith (ROLE `p`) and its children (ROLE `c1`…): random operations on
/// names of its own (prefix ROLE-) in the dirs it may write, so the workers never race on a name
/// and a native run must give exactly the same results. Cross-zone links (EXDEV), renames of a
/// file that has other names into another zone (EXDEV: the file would be hard-linked across
/// zones) and a child's create in its own inbox (EACCES) are the policy's expected denials: in
/// MODE `native` their result is predicted instead of executed (after the errors the kernel
/// gives first). A 6th argument `nolink` turns links into reads.
/// Prints one JSON object: the results and a listing.
pub const STORM_PY: &str = r##"
import os, sys, json, random, errno, hashlib, ctypes, stat
base, role, seed, count, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
links = len(sys.argv) < 7 or sys.argv[6] != "nolink"
libc = ctypes.CDLL(None, use_errno=True)
def renameat2(a, b, flags):
    if libc.renameat2(-100, a.encode(), -100, b.encode(), ctypes.c_uint(flags)) != 0:
        e = ctypes.get_errno(); raise OSError(e, os.strerror(e))
R = "smiths/smith-root"
if role == "p":
    dirs = [f"{R}/private"] + [f"{R}/children/smith-00{k}/inbox" for k in range(1, 5)]
    zone = lambda d: d
    denied_create = None
else:
    k = role[1:]
    c = f"{R}/children/smith-00{k}"
    dirs = [f"{c}/private", f"{c}/private/sub", f"{c}/outbox"]
    zone = lambda d: "outbox" if d.endswith("outbox") else "private"
    denied_create = f"{c}/inbox"
os.chdir(base)
for d in dirs:
    if role != "p" and d.endswith("/sub"):
        try: os.mkdir(d)
        except FileExistsError: pass
rng = random.Random(seed)
names = [f"{role}-{i}" for i in range(12)]
res = []
def name(): return f"{rng.choice(dirs)}/{rng.choice(names)}"
def linked_move(a, b, noreplace):
    # The policy's EXDEV for a file with other names renamed into another zone, predicted on a
    # native dir after what the kernel checks first (no source, EEXIST, same file, onto a dir).
    if mode != "native" or zone(a.rsplit("/", 1)[0]) == zone(b.rsplit("/", 1)[0]):
        return None
    try: sa = os.lstat(a)
    except FileNotFoundError: return None
    if stat.S_ISDIR(sa.st_mode) or sa.st_nlink < 2:
        return None
    try: sb = os.lstat(b)
    except FileNotFoundError: sb = None
    if sb is not None and (noreplace or sb.st_ino == sa.st_ino or stat.S_ISDIR(sb.st_mode)):
        return None
    return "EXDEV"
def do(tag, f):
    try:
        r = f()
        res.append(f"{tag} {r if r is not None else 'ok'}")
    except OSError as e:
        res.append(f"{tag} {errno.errorcode[e.errno]}")
for i in range(count):
    op = rng.choice(["create", "create", "write", "read", "rename", "rename", "rename_nr", "link",
                     "link", "unlink", "unlink", "mkdir", "rmdir", "denied"])
    a, b = name(), name()
    data = hashlib.sha256(f"{seed} {i}".encode()).digest() * rng.randint(0, 40)
    if op == "link" and not links:
        op = "read"
    if op == "create":
        def f():
            fd = os.open(a, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, data); os.close(fd)
        do(f"create {a}", f)
    elif op == "write":
        def f():
            fd = os.open(a, os.O_WRONLY | os.O_TRUNC)
            os.write(fd, data); os.close(fd)
        do(f"write {a}", f)
    elif op == "read":
        do(f"read {a}", lambda: hashlib.sha256(open(a, "rb").read()).hexdigest()[:12])
    elif op == "rename":
        r = linked_move(a, b, False)
        if r: res.append(f"rename {a} {b} {r}")
        else: do(f"rename {a} {b}", lambda: os.rename(a, b))
    elif op == "rename_nr":
        r = linked_move(a, b, True)
        if r: res.append(f"rename_nr {a} {b} {r}")
        else: do(f"rename_nr {a} {b}", lambda: renameat2(a, b, 1))
    elif op == "link":
        da, db = a.rsplit("/", 1)[0], b.rsplit("/", 1)[0]
        if zone(da) != zone(db) and mode == "native":
            if not os.path.lexists(a): r = "ENOENT"
            elif os.path.lexists(b): r = "EEXIST"
            elif os.path.isdir(a): r = "EPERM"
            else: r = "EXDEV"
            res.append(f"link {a} {b} {r}")
        else:
            do(f"link {a} {b}", lambda: os.link(a, b))
    elif op == "unlink":
        do(f"unlink {a}", lambda: os.unlink(a))
    elif op == "mkdir":
        do(f"mkdir {a}", lambda: os.mkdir(a))
    elif op == "rmdir":
        do(f"rmdir {a}", lambda: os.rmdir(a))
    elif op == "denied" and denied_create:
        t = f"{denied_create}/{rng.choice(names)}"
        if mode == "native":
            res.append(f"denied {t} EACCES")
        else:
            do(f"denied {t}", lambda: os.close(os.open(t, os.O_WRONLY | os.O_CREAT, 0o644)))
listing = []
for d in dirs:
    for root, ds, fs in os.walk(d):
        for n in sorted(ds + fs):
            if not n.startswith(role + "-"):
                continue
            p = f"{root}/{n}"
            st = os.lstat(p)
            h = hashlib.sha256(open(p, "rb").read()).hexdigest()[:12] if os.path.isfile(p) else "dir"
            listing.append(f"{p} {st.st_nlink if os.path.isfile(p) else '-'} {st.st_size if os.path.isfile(p) else '-'} {h}")
print(json.dumps({"results": res, "listing": sorted(set(listing))}))
"##;

/// A watchdog worker (argv: MOUNT ROLE SECONDS HEARTBEAT): heavy agent I/O for SECONDS — for a
/// child (`c1`…): write + fsync in private/, rename onto outbox/result.md (fires
/// `result.published`), list and stat its dirs, try a sibling's private/ (a denial:
/// `access.denied`); for the root (`p`): task files into its children's inboxes (fires
/// `task.assigned`) and listings; for the operator (`o`): status.json, events.jsonl, whoami.
/// Before each operation it writes `COUNT START_NS OP` at offset 0 of HEARTBEAT (outside the
/// mount), so a watchdog sees which operation is stuck and since when. Prints the count.
pub const WATCHDOG_PY: &str = r##"
import os, sys, time
mount, role, secs, hb = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
hfd = os.open(hb, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
R = f"{mount}/smiths/smith-root"
n = 0
def beat(op):
    os.pwrite(hfd, f"{n} {time.monotonic_ns()} {op}".ljust(120).encode(), 0)
def step(op, f):
    global n
    beat(op)
    try:
        f()
    except PermissionError:
        pass
    n += 1
end = time.monotonic() + secs
i = 0
while time.monotonic() < end:
    i += 1
    if role.startswith("c"):
        c = f"{R}/children/smith-00{role[1:]}"
        sib = f"{R}/children/smith-00{1 + int(role[1:]) % 4}"
        def w():
            fd = os.open(f"{c}/private/f{i % 20}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.write(fd, os.urandom(4096 * (i % 8))); os.fsync(fd); os.close(fd)
        step("write", w)
        def pub():
            with open(f"{c}/private/r.tmp", "w") as f:
                f.write(f"result {i}\n")
            os.rename(f"{c}/private/r.tmp", f"{c}/outbox/result.md")
        if i % 5 == 0:
            step("publish", pub)
        step("rename", lambda: os.rename(f"{c}/private/f{i % 20}", f"{c}/private/g{i % 7}"))
        step("listdir", lambda: [os.stat(f"{c}/private/{x}") for x in os.listdir(f"{c}/private")])
        if i % 10 == 0:
            step("denied", lambda: os.listdir(f"{sib}/private"))
    elif role == "p":
        def task():
            k = 1 + i % 4
            with open(f"{R}/private/t.tmp", "w") as f:
                f.write(f"# Task {i}\n")
            os.rename(f"{R}/private/t.tmp", f"{R}/children/smith-00{k}/inbox/task-{i}.md")
        if i % 3 == 0:
            step("task", task)
        step("listdir", lambda: [os.listdir(f"{R}/children/smith-00{k}/outbox") for k in range(1, 5)])
    else:
        step("status", lambda: open(f"{mount}/.smithfs/status.json").read())
        step("events", lambda: open(f"{mount}/.smithfs/events.jsonl").read())
        step("whoami", lambda: open(f"{mount}/.smithfs/whoami").read())
        step("walk", lambda: sum(len(f) for _, _, f in os.walk(f"{R}/children")))
beat("done")
print(n)
"##;
