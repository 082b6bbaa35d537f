//! Storage quotas and the store's reserve (docs/SPEC.md §8) on real mounts with real agents: a
//! smith writing until `EDQUOT` while its siblings publish and its parent scaffolds, in cgroup
//! and in ancestry identity mode; the counters after a storm of fallocate, truncation, sparse
//! files, hard links, renames and unlinks of open files equal what a restart's scan finds; the
//! store filling for real (a small loop-mounted ext4) leaves the daemon its reserve.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::msched::*;
use common::{is_root, poll_until, run_as, smithfs, storage_of};
use serde_json::{json, Value};

/// The agent of these tests: the first line of the task is a directive. `split` makes one
/// child per further line and gives it that line as its task; `fill` writes `private/fill`
/// until a write fails and publishes the error; `after-fill` waits until its sibling
/// `smith-001` has published, then scaffolds a child of its own with the task `ok` (and is
/// woken again when that child is done); `ok` publishes.
const AGENT: &str = concat!(
    agent_prelude!(),
    agent_split!(),
    r#"fill)
  e=$(mktemp)
  dd if=/dev/zero of=private/fill bs=64k 2> "$e"
  err=$(grep -o 'Disk quota exceeded\|No space left on device' "$e" | head -n 1)
  rm -f "$e"
  truncate -s -128K private/fill
  publish "fill: ${err:-none}" ;;
after-fill)
  while [ ! -e ../smith-001/outbox/result.md ]; do sleep 0.05; done
  mkdir children/smith-001 || exit 7
  printf 'ok\n' > private/t.md && mv private/t.md children/smith-001/inbox/task-1.md
  exit 0 ;;
ok) publish "ok from $SMITH_ID" ;;
spew)
  i=0
  while [ $i -lt 40000 ]; do
    echo "line $i of a run printing without end, padded to about a hundred bytes ............"
    i=$((i+1))
  done
  echo "stderr too" >&2
  publish "spew done, exit status of the last echo $?" ;;
tick)
  for i in $(seq 1 25); do echo "tick $(date +%s%3N)"; sleep 0.1; done
  publish "ticked" ;;
*) echo "unknown directive $cmd"; exit 2 ;;
esac
"#
);

/// Install [`AGENT`] in the mount (over the one `Sm::new` installed) and remount.
fn with_agent(patch: Value) -> Sm {
    let s = Sm::new(patch);
    // The agent is read at each run: no remount needed.
    std::fs::write(s.p("agents/agent.sh"), AGENT).expect("agent");
    s
}

fn quota_fleet(identity: &str) {
    let s = with_agent(json!({
        "identity": identity,
        "limits": {"max_bytes_per_smith": "1M", "max_inodes_per_smith": 500}
    }));
    s.task("split\nfill\nafter-fill\n");
    let fin = s.wait_file(90, "results/final.md");
    assert!(fin.contains("fill: Disk quota exceeded"), "{fin}");
    assert!(
        fin.contains("ok from smith-001"),
        "the grandchild published: {fin}"
    );
    // The filler holds at most its quota, and nearly all of it.
    let (bytes, _) = storage_of(s.m.path(), "smith-root/smith-001");
    assert!(bytes <= 1 << 20, "{bytes}");
    assert!(bytes >= (1 << 20) - (384 << 10), "{bytes}");
    let filled = std::fs::metadata(s.p(&format!("{}/private/fill", rel("smith-root/smith-001"))))
        .expect("fill")
        .len();
    assert!((600 << 10..=1 << 20).contains(&filled), "{filled}");
    // The refusal is journaled with its rule and explained to the smith.
    let denied = s.of("access.denied", Some("smith-root/smith-001"));
    assert!(
        denied
            .iter()
            .any(|e| e["rule"] == "storage-bytes-per-smith"),
        "{denied:#?}"
    );
    let why = smithfs([
        "run",
        "--mount",
        &s.dir(),
        "--smith",
        "smith-root/smith-001",
        "--",
        "cat",
        &format!("{}/.smithfs/why", s.dir()),
    ])
    .expect_ok("why");
    assert!(why.contains("max_bytes_per_smith"), "{why}");
    // A restart rebuilds the same counters by its scan, and the limit still holds.
    let before = storage_of(s.m.path(), "smith-root/smith-001");
    let mut s = s;
    s.m.remount();
    assert_eq!(storage_of(s.m.path(), "smith-root/smith-001"), before);
    let more = smithfs([
        "run",
        "--mount",
        &s.dir(),
        "--smith",
        "smith-root/smith-001",
        "--",
        "sh",
        "-c",
        &format!(
            "cd {}/{} && dd if=/dev/zero of=private/more bs=64k count=8 2>&1",
            s.dir(),
            rel("smith-root/smith-001")
        ),
    ]);
    assert!(
        !more.ok(),
        "wrote past its quota after a restart: {}",
        more.stdout
    );
    assert!(
        more.stdout.contains("Disk quota exceeded"),
        "{}",
        more.stdout
    );
}

/// One smith writing until EDQUOT while a sibling publishes and scaffolds a child of its own and
/// the root gathers: every other smith and the daemon keep working (cgroup identity where the
/// machine has it).
#[test]
fn a_smith_at_its_byte_quota_leaves_its_siblings_and_parent_working() {
    quota_fleet("auto");
}

/// The same in ancestry identity mode: storage quotas are the daemon's, whatever the identity.
#[test]
fn storage_quotas_hold_in_ancestry_mode() {
    quota_fleet("ancestry");
}

/// The storm: every operation that changes allocation, by a bound process, then a restart.
const STORM: &str = r#"
import os, sys
d = sys.argv[1]
p = lambda *n: os.path.join(d, *n)
os.chdir(d)
# Writes and a sparse file.
with open(p("private", "a"), "wb") as f:
    f.write(b"a" * 300_000)
with open(p("private", "sparse"), "wb") as f:
    f.truncate(50 << 20)
    f.seek(20 << 20); f.write(b"x" * 10_000)
# fallocate, punch a hole, keep-size preallocation.
fd = os.open(p("private", "alloc"), os.O_RDWR | os.O_CREAT, 0o644)
os.posix_fallocate(fd, 0, 1 << 20)
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 1, 2
assert libc.fallocate(fd, FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE, ctypes.c_long(256 << 10), ctypes.c_long(256 << 10)) == 0
assert libc.fallocate(fd, FALLOC_FL_KEEP_SIZE, ctypes.c_long(2 << 20), ctypes.c_long(128 << 10)) == 0
os.close(fd)
# Truncate up and down.
os.truncate(p("private", "a"), 10 << 20)
os.truncate(p("private", "a"), 100_000)
# Hard links, directories, symlinks, renames between own areas.
os.link(p("private", "a"), p("private", "a-link"))
os.makedirs(p("private", "tree", "deep"))
for i in range(50):
    with open(p("private", "tree", "deep", "f%d" % i), "wb") as f:
        f.write(b"t" * 5000)
os.symlink("a", p("private", "sym"))
os.rename(p("private", "tree"), p("outbox", "tree"))
with open(p("private", "pub"), "wb") as f:
    f.write(b"p" * 40_000)
os.rename(p("private", "pub"), p("outbox", "pub"))
# Unlink of an open file that is written after the unlink.
f = open(p("private", "open"), "wb")
f.write(b"o" * 200_000); f.flush()
os.unlink(p("private", "open"))
f.write(b"o" * 100_000); f.flush()
f.close()
# A task written into the child's inbox counts for the writer.
with open(p("children", "smith-001", "inbox", "note.md"), "wb") as f:
    f.write(b"n" * 12_000)
os.unlink(p("private", "a-link"))
print("storm done")
"#;

/// The counters after the storm equal what the restart's scan finds, for the smith and for
/// its child.
#[test]
fn counters_match_a_scan_after_a_storm_and_a_restart() {
    let mut s = with_agent(json!({"limits": {"max_bytes_per_smith": "1G"}}));
    std::fs::create_dir(s.p("smiths/smith-root/children/smith-001")).expect("scaffold");
    let root_dir = s.p("smiths/smith-root");
    let out = smithfs([
        "run",
        "--mount",
        &s.dir(),
        "--smith",
        "smith-root",
        "--",
        "python3",
        "-c",
        STORM,
        root_dir.to_str().expect("utf-8"),
    ])
    .expect_ok("storm");
    assert!(out.contains("storm done"), "{out}");
    // The kernel forgets the unlinked open file soon after its last close.
    let mut live = (0, 0);
    poll_until(Duration::from_secs(10), "the counters to settle", || {
        let a = storage_of(s.m.path(), "smith-root");
        let b = storage_of(s.m.path(), "smith-root");
        live = a;
        a == b && a.1 > 0
    });
    let child_live = storage_of(s.m.path(), "smith-root/smith-001");
    s.m.remount();
    let scanned = storage_of(s.m.path(), "smith-root");
    let child_scanned = storage_of(s.m.path(), "smith-root/smith-001");
    eprintln!("root: live {live:?}, scanned {scanned:?}; child: live {child_live:?}, scanned {child_scanned:?}");
    assert_eq!(
        live, scanned,
        "root: counters before the restart vs its scan"
    );
    assert_eq!(child_live, child_scanned, "child");
}

/// A loop-mounted ext4 image of `mib` MiB at `dir/fs`, unmounted (and its loop device
/// detached) on drop — only what this guard made.
struct LoopFs {
    mnt: PathBuf,
}

impl LoopFs {
    fn new(dir: &Path, mib: u64) -> Option<LoopFs> {
        let img = dir.join("store.img");
        let f = std::fs::File::create(&img).ok()?;
        f.set_len(mib << 20).ok()?;
        drop(f);
        let mkfs = std::process::Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "0"])
            .arg(&img)
            .output()
            .ok()?;
        if !mkfs.status.success() {
            eprintln!("mkfs.ext4: {}", String::from_utf8_lossy(&mkfs.stderr));
            return None;
        }
        let mnt = dir.join("fs");
        std::fs::create_dir(&mnt).ok()?;
        let mount = std::process::Command::new("mount")
            .args(["-o", "loop"])
            .arg(&img)
            .arg(&mnt)
            .output()
            .ok()?;
        if !mount.status.success() {
            eprintln!("mount -o loop: {}", String::from_utf8_lossy(&mount.stderr));
            return None;
        }
        Some(LoopFs { mnt })
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        // `mount -o loop` sets autoclear: unmounting detaches the loop device.
        let ok = std::process::Command::new("umount")
            .arg(&self.mnt)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.mnt)
                .status();
        }
    }
}

/// A smithfs mount at `dir` (made by `init`), unmounted on drop.
struct Mounted {
    dir: PathBuf,
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let d = self.dir.display().to_string();
        if !smithfs(["umount", &d]).ok() {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.dir)
                .status();
        }
    }
}

/// The store fills for real: a smith without a quota writes into a 64 MiB ext4 until it fails
/// with ENOSPC at the daemon's reserve, while a sibling publishes and scaffolds a child, the
/// root gathers, `results/final.md` is written and the journal goes on.
#[test]
fn the_store_filling_for_real_keeps_the_daemons_reserve() {
    if !is_root() {
        eprintln!("skipped: needs root (a loop mount)");
        return;
    }
    common::skip_unless_fuse_usable();
    let tmp = tempfile::Builder::new()
        .prefix("smithfs-loop-")
        .tempdir()
        .expect("tempdir");
    let Some(lo) = LoopFs::new(tmp.path(), 64) else {
        eprintln!("skipped: cannot make a loop-mounted ext4 here");
        return;
    };
    let dir = lo.mnt.join("m");
    let d = dir.display().to_string();
    smithfs(["init", &d]).expect_ok("init");
    std::fs::write(dir.join("agents/agent.sh"), AGENT).expect("agent");
    let cfg = json!({
        "agent": {"command": ["sh", "{mount}/agents/agent.sh"], "timeout_secs": 120},
    });
    std::fs::write(dir.join("config.json"), cfg.to_string()).expect("config");
    smithfs(["mount", &d, "--allow-other"]).expect_ok("mount");
    let m = Mounted { dir: dir.clone() };
    let started = Instant::now();
    std::fs::write(
        m.dir.join("smiths/smith-root/inbox/task-1.md"),
        "split\nfill\nafter-fill\n",
    )
    .expect("task");
    let fin = m.dir.join("results/final.md");
    let text = poll_until(Duration::from_secs(120), "results/final.md", || {
        std::fs::read_to_string(&fin).ok().filter(|t| !t.is_empty())
    });
    assert!(text.contains("fill: No space left on device"), "{text}");
    assert!(text.contains("ok from smith-001"), "{text}");
    // What is left is (about) the reserve: the daemon's writes had room.
    let st = nix::sys::statvfs::statvfs(&lo.mnt).expect("statvfs");
    let free = st.blocks_available() * st.fragment_size();
    assert!(free >= 2 << 20, "the reserve is gone: {free} bytes free");
    let journal = std::fs::read_to_string(m.dir.join(".smithfs/events.jsonl")).expect("journal");
    assert!(
        journal.contains("\"store-reserve\""),
        "the refusal is journaled"
    );
    assert!(journal.contains("result.published"));
    eprintln!(
        "filled a 64 MiB store in {:?}; {} KiB left",
        started.elapsed(),
        free >> 10
    );
    drop(m);
}

/// A limited smith's writes reach the daemon, also when it holds other files open for reading
/// (passed through); a file it holds open for reading it can open for writing only while below
/// its quota — the kernel takes no other open beside a passthrough one, so that writer is
/// passed through too and counted at its close (PROTOCOL-NOTES L13).
#[test]
fn a_limited_writer_beside_a_passthrough_reader() {
    let s = with_agent(json!({"limits": {"max_bytes_per_smith": "512K"}}));
    let d = s.p("smiths/smith-root/private");
    std::fs::write(d.join("f"), b"seed").expect("seed");
    // The operator's file: writable by the run's uid too (a sandboxed run is not root, §12).
    std::fs::set_permissions(d.join("f"), std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let code = r#"
import os, sys, errno
d = sys.argv[1]
r = os.open(os.path.join(d, "f"), os.O_RDONLY)
assert os.read(r, 4) == b"seed"
w = os.open(os.path.join(d, "g"), os.O_WRONLY | os.O_CREAT, 0o644)
n, err = 0, "none"
try:
    while n < (4 << 20):
        n += os.pwrite(w, b"z" * 4096, n)
except OSError as e:
    err = errno.errorcode[e.errno]
try:
    os.open(os.path.join(d, "f"), os.O_WRONLY)
    again = "opened"
except OSError as e:
    again = errno.errorcode[e.errno]
print(err, n, again)
"#;
    let out = smithfs([
        "run",
        "--mount",
        &s.dir(),
        "--smith",
        "smith-root",
        "--",
        "python3",
        "-c",
        code,
        d.to_str().expect("utf-8"),
    ])
    .expect_ok("writer");
    let words: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(words.first(), Some(&"EDQUOT"), "{out}");
    let n: u64 = words.get(1).and_then(|w| w.parse().ok()).expect("count");
    assert!((256 << 10..=512 << 10).contains(&n), "{out}");
    assert_eq!(words.get(2), Some(&"EDQUOT"), "{out}");
}

/// A run printing without end (4 MB to a 1 MiB quota): its `messages.log` stops a sixteenth
/// short of the quota (room for its result) with one marker line and one `run.output_dropped`, the agent never gets `SIGPIPE`/`EPIPE`
/// and finishes (publishes, exits 0), its sibling and the root work on, the daemon writes
/// `results/final.md`, and the counters equal a restart's scan.
#[test]
fn a_run_printing_without_end_stops_at_its_quota_and_lives_on() {
    let s = with_agent(json!({"limits": {"max_bytes_per_smith": "1M"}}));
    s.task("split\nspew\nok\n");
    let fin = s.wait_file(90, "results/final.md");
    assert!(
        fin.contains("spew done, exit status of the last echo 0"),
        "{fin}"
    );
    assert!(fin.contains("ok from smith-002"), "{fin}");
    let spewer = "smith-root/smith-001";
    let exited = s.of("run.exited", Some(spewer));
    assert!(
        exited
            .iter()
            .all(|e| e["exit_code"] == 0 && e["reason"] == "exit"),
        "{exited:#?}"
    );
    let log = std::fs::read(s.p(&format!(
        "{}/conversations/run-0001/messages.log",
        rel(spewer)
    )))
    .expect("messages.log");
    let text = String::from_utf8_lossy(&log);
    assert!(
        log.len() <= 1 << 20,
        "the log passed the quota: {}",
        log.len()
    );
    assert!(
        log.len() >= 512 << 10,
        "the log stopped early: {}",
        log.len()
    );
    assert_eq!(
        text.matches("smithfs: output dropped").count(),
        1,
        "one marker line"
    );
    assert!(
        text.trim_end().ends_with("(storage-bytes-per-smith)"),
        "the marker ends it"
    );
    assert!(
        text.starts_with("line 0 "),
        "{}",
        &text[..80.min(text.len())]
    );
    let dropped = s.of("run.output_dropped", Some(spewer));
    assert_eq!(dropped.len(), 1, "{dropped:#?}");
    assert_eq!(dropped[0]["rule"], "storage-bytes-per-smith");
    assert_eq!(dropped[0]["run_id"], "run-0001");
    // The log is the smith's: it holds (about) its quota, counted as a restart's scan counts.
    let live = storage_of(s.m.path(), spewer);
    assert!(live.0 <= (1 << 20) + (64 << 10), "{live:?}");
    let mut s = s;
    s.m.remount();
    assert_eq!(storage_of(s.m.path(), spewer), live, "counters vs scan");
    // Its own write now fails, and why points at what holds the space: its runs' output,
    // which it cannot remove itself (docs/PROTOCOL-NOTES.md L22).
    let r = run_as(
        s.m.path(),
        spewer,
        &[
            "bash",
            "-c",
            &format!(
                "cd {} && head -c 200000 /dev/zero > private/more; cat \"$SMITH_MOUNT/.smithfs/why\"",
                rel(spewer)
            ),
        ],
    );
    assert!(r.stderr.contains("Disk quota exceeded"), "{r:?}");
    assert!(
        r.stdout
            .contains("They are held in conversations/ (your runs' output"),
        "{r:?}"
    );
    assert!(
        r.stdout
            .contains("ask the operator to remove old runs' directories"),
        "{r:?}"
    );
}

/// `smithfs logs --follow` shows each line of a live run within a second of its printing
/// (the daemon writes the log and tells the kernel it grew).
#[test]
fn logs_follow_sees_new_lines_within_a_second() {
    use std::io::BufRead;
    let s = with_agent(json!({}));
    s.task("tick\n");
    poll_until(Duration::from_secs(30), "the run to start", || {
        s.p("smiths/smith-root/conversations/run-0001/messages.log")
            .exists()
    });
    let mut child = std::process::Command::new(common::SMITHFS)
        .args(["logs", &s.dir(), "smith-root", "--follow"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("logs --follow");
    let out = child.stdout.take().expect("stdout");
    let mut lags = Vec::new();
    for line in std::io::BufReader::new(out).lines() {
        let line = line.expect("line");
        let Some(ms) = line
            .strip_prefix("tick ")
            .and_then(|t| t.parse::<u128>().ok())
        else {
            continue;
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis();
        lags.push(now.saturating_sub(ms));
    }
    let status = child.wait().expect("wait");
    assert!(status.success(), "logs --follow ended with {status}");
    eprintln!("lags (ms): {lags:?}");
    assert_eq!(lags.len(), 25, "every tick seen: {lags:?}");
    assert!(lags.iter().all(|l| *l < 1000), "{lags:?}");
}

/// A limited writer that joins a passthrough reader of the same file (the kernel takes no other
/// open beside it, PROTOCOL-NOTES L13) writes past the daemon; the books catch up with it while
/// it is still open (the once-a-second upkeep), not only at its close.
#[test]
fn a_joined_passthrough_writer_shows_in_the_books_while_open() {
    let s = with_agent(json!({"limits": {"max_bytes_per_smith": "64M"}}));
    let d = s.p("smiths/smith-root/private");
    std::fs::write(d.join("f"), b"seed").expect("seed");
    // The operator's file: writable by the run's uid too (a sandboxed run is not root, §12).
    std::fs::set_permissions(d.join("f"), std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let code = r#"
import os, sys, time
d, whoami = sys.argv[1], sys.argv[2]
def used():
    for line in open(whoami).read().splitlines():
        if line.startswith("storage bytes:"):
            return int(line.split(":")[1])
before = used()
r = os.open(os.path.join(d, "f"), os.O_RDONLY)
w = os.open(os.path.join(d, "f"), os.O_WRONLY)
os.pwrite(w, b"j" * (1 << 20), 0)
t = time.time()
while used() < before + 1_000_000 and time.time() - t < 5:
    time.sleep(0.05)
print("seen" if used() >= before + 1_000_000 else "stale", round(time.time() - t, 2))
os.close(w); os.close(r)
"#;
    let out = smithfs([
        "run",
        "--mount",
        &s.dir(),
        "--smith",
        "smith-root",
        "--",
        "python3",
        "-c",
        code,
        d.to_str().expect("utf-8"),
        &format!("{}/.smithfs/whoami", s.dir()),
    ])
    .expect_ok("joined writer");
    eprintln!("{out}");
    assert!(out.starts_with("seen"), "{out}");
}

/// Directories and symlinks allocate blocks too: a smith making long-target symlinks and
/// directories without end meets `EDQUOT` at its byte quota, like a writer does (trial finding
/// F-quota-1, note L19), and its books stay within the quota.
#[test]
fn symlinks_and_directories_stop_at_the_byte_quota() {
    let s = with_agent(json!({"limits": {"max_bytes_per_smith": "1M"}}));
    std::fs::create_dir(s.p("smiths/smith-root/children/smith-001")).expect("scaffold");
    let dir = format!("{}/{}", s.dir(), rel("smith-root/smith-001"));
    let script = r#"
import errno, os, sys
os.chdir(sys.argv[1])
made, err = 0, None
target = "a" * 4000
try:
    for i in range(3000):
        os.symlink(target, "private/L%d" % i)
        os.mkdir("private/d%d" % i)
        made += 1
except OSError as e:
    err = errno.errorcode.get(e.errno, str(e.errno))
print(made, err)
"#;
    let out = smithfs([
        "run",
        "--mount",
        &s.dir(),
        "--smith",
        "smith-root/smith-001",
        "--",
        "python3",
        "-c",
        script,
        &dir,
    ])
    .expect_ok("symlink storm");
    let mut words = out.split_whitespace();
    let made: u64 = words.next().and_then(|w| w.parse().ok()).expect("count");
    assert_eq!(words.next(), Some("EDQUOT"), "{out}");
    // Each pair allocates two blocks (8 KiB): a 1 MiB quota admits at most 128 pairs.
    assert!(made <= 128, "{out}");
    let (bytes, _) = storage_of(s.m.path(), "smith-root/smith-001");
    assert!(bytes <= 1 << 20, "{bytes}");
}

/// `results/**` is written by the root smith alone among smiths, so it counts for the root
/// (docs/PROTOCOL-NOTES.md L9): a file there raises the root's usage, one past its quota is
/// refused with EDQUOT, the daemon's `results/final.md` costs nothing, and a restart's scan
/// finds the same figures.
#[test]
fn the_root_smiths_results_count_for_it() {
    let mut s = with_agent(json!({"limits": {"max_bytes_per_smith": "1M"}}));
    let before = storage_of(s.m.path(), "smith-root");
    // As the root smith, in the mount's root.
    let root_sh = |script: &str| run_as(s.m.path(), "smith-root", &["bash", "-c", script]);
    root_sh("head -c 262144 /dev/zero > results/notes.bin && mkdir results/more")
        .expect_ok("write results/");
    let after = storage_of(s.m.path(), "smith-root");
    assert!(after.0 >= before.0 + (256 << 10), "{before:?} → {after:?}");
    assert_eq!(after.1, before.1 + 2, "{before:?} → {after:?}");
    let r = root_sh("head -c 2097152 /dev/zero > results/more/big.bin");
    assert!(r.stderr.contains("Disk quota exceeded"), "{r:?}");
    std::fs::remove_file(s.p("results/more/big.bin")).expect("operator removes");
    // The daemon's copy of the root's result is not charged.
    s.task("ok\n");
    let fin = s.wait_file(60, "results/final.md");
    assert!(fin.contains("ok from smith-root"), "{fin}");
    let with_final = storage_of(s.m.path(), "smith-root");
    s.m.remount();
    assert_eq!(
        storage_of(s.m.path(), "smith-root"),
        with_final,
        "scan after restart"
    );
    let notes = std::fs::metadata(s.p("results/notes.bin")).expect("notes");
    assert_eq!(notes.len(), 256 << 10);
}
