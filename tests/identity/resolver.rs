//! The identity engine against real processes, in both modes, without FUSE (docs/SPEC.md §2):
//! bound trees (a double-forked orphan, a `setsid` background child, a child in a new pid namespace)
//! stay their smith; unbound processes are the operator; unbound children of the daemon are
//! Unknown; a recycled pid never inherits a smith.
//!
//! Needs root (cgroup mode, `clone3` with `set_tid`) and Linux ≥ 6.13. The "daemon" is a stand-in
//! process, so that this test process and its children are outside it. Tests run one at a time
//! (they reap children and the process is a subreaper); every process and cgroup is removed by
//! guards, also on failure.

use std::ffi::CString;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use smithfs::config::IdentityMode;
use smithfs::identity::{Effective, Identity, IdentityError, Resolver};
use smithfs::tree::model::SmithIdx;

static SERIAL: Mutex<()> = Mutex::new(());

const ROOT: SmithIdx = SmithIdx(0);
const CHILD: SmithIdx = SmithIdx(1);

/// A child process killed and reaped on drop.
struct Proc(Child);

impl Proc {
    fn spawn(cmd: &mut Command) -> Proc {
        Proc(cmd.spawn().expect("spawn"))
    }
    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Kills and reaps (if ours) extra pids on drop: orphans that re-parented to this subreaper.
struct Pids(Vec<u32>);

impl Drop for Pids {
    fn drop(&mut self) {
        for &pid in &self.0 {
            let pid = pid as libc::pid_t;
            // SAFETY: kill/waitpid with integers; these pids were created by this test and are
            // still pinned as our children or zombies until reaped here.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
    }
}

/// A resolver that kills its smiths and removes its cgroups on drop (test cleanup).
struct Engine(Resolver);

impl Drop for Engine {
    fn drop(&mut self) {
        for idx in [ROOT, CHILD] {
            let _ = self.0.kill_smith(idx, libc::SIGKILL);
        }
        let parent = self.0.cgroup_parent().map(Path::to_path_buf);
        let r = self.0.shutdown(true);
        if let Some(p) = parent {
            assert!(!p.exists(), "{} left behind ({r:?})", p.display());
        }
    }
}

/// A stand-in daemon with one unbound child; returns (daemon, its child's pid). Drop the daemon
/// guard after the returned pid list, which kills the child.
struct Daemon {
    proc_: Proc,
    _child: Pids,
}

impl Daemon {
    fn pid(&self) -> u32 {
        self.proc_.pid()
    }
}

fn fake_daemon(dir: &Path) -> (Daemon, u32) {
    let file = dir.join("daemon-child");
    let p = Proc::spawn(
        Command::new("sh")
            .arg("-c")
            .arg("sleep 600 & echo $! > \"$0.tmp\"; mv \"$0.tmp\" \"$0\"; wait")
            .arg(&file),
    );
    let child = read_pid(&file);
    (
        Daemon {
            proc_: p,
            _child: Pids(vec![child]),
        },
        child,
    )
}

fn poll_until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn read_pid(file: &Path) -> u32 {
    poll_until(&file.display().to_string(), || {
        std::fs::read_to_string(file).ok()?.trim().parse().ok()
    })
}

fn engine(mode: IdentityMode, daemon: u32) -> Option<Engine> {
    match Resolver::new(mode, daemon) {
        Ok(r) => {
            r.register_smith(ROOT, "smith-root").expect("register root");
            r.register_smith(CHILD, "smith-root/smith-001")
                .expect("register child");
            Some(Engine(r))
        }
        Err(IdentityError::NoCgroup(why)) => {
            eprintln!("skipping cgroup mode: {why}");
            None
        }
        Err(e) => panic!("Resolver::new: {e}"),
    }
}

/// A keeper-like process: a child subreaper that waits for "go" on stdin, then runs `script`
/// with `$0` = `dir`, then stays (so that orphans re-parent to it).
fn keeper(dir: &Path, script: &str) -> (Proc, std::process::ChildStdin) {
    let body = format!("read go\n{script}\necho 1 > \"$0/ready\"\nexec sleep 600");
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(body).arg(dir).stdin(Stdio::piped());
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut p = Proc::spawn(&mut cmd);
    let stdin = p.0.stdin.take().expect("stdin");
    (p, stdin)
}

fn first_child(pid: u32) -> u32 {
    let f = format!("/proc/{pid}/task/{pid}/children");
    poll_until(&f, || {
        std::fs::read_to_string(&f)
            .ok()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

fn ppid(pid: u32) -> u32 {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).expect("stat");
    smithfs::sys::procfs::parse_stat(&stat)
        .expect("parse stat")
        .ppid as u32
}

const TREE: &str = r#"
sh -c 'sleep 600 & echo $! > "$0/orphan"' "$0"
sh -c 'setsid sleep 600 & echo $! > "$0/setsid"' "$0"
unshare -pf sleep 600 & echo $! > "$0/unshare"
"#;

fn bound_tree(mode: IdentityMode) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tempdir");
    let (daemon, daemon_child) = fake_daemon(tmp.path());
    let Some(engine) = engine(mode, daemon.pid()) else {
        return;
    };
    let r = &engine.0;
    let (keeper, mut go) = keeper(tmp.path(), TREE);
    r.bind(keeper.pid(), CHILD).expect("bind keeper");
    writeln!(go, "go").expect("go");
    read_pid(&tmp.path().join("ready"));
    let orphan = read_pid(&tmp.path().join("orphan"));
    let setsid = read_pid(&tmp.path().join("setsid"));
    let unshare = read_pid(&tmp.path().join("unshare"));
    let in_ns = first_child(unshare);
    let _extra = Pids(vec![orphan, setsid, unshare]);

    let smith = Identity::Smith(CHILD);
    assert_eq!(r.resolve(keeper.pid()), smith, "the bound process");
    assert_eq!(
        ppid(orphan),
        keeper.pid(),
        "orphan re-parented to the keeper"
    );
    assert_eq!(r.resolve(orphan), smith, "double-forked orphan");
    assert_eq!(r.resolve(setsid), smith, "setsid background child");
    assert_eq!(r.resolve(unshare), smith, "unshare -pf");
    assert_eq!(r.resolve(in_ns), smith, "pid 1 of a new pid namespace");
    // Hits answer the same.
    assert_eq!(r.resolve(orphan), smith);
    assert_eq!(r.resolve(in_ns), smith);

    let me = std::process::id();
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() } as u32;
    assert_eq!(r.resolve(tid), Identity::Operator, "this test's thread");
    let other = std::thread::spawn(|| {
        // SAFETY: gettid has no preconditions.
        unsafe { libc::gettid() as u32 }
    });
    let _ = other.join();
    let sleeper = Proc::spawn(Command::new("sleep").arg("600"));
    assert_eq!(
        r.resolve(sleeper.pid()),
        Identity::Operator,
        "unbound child"
    );
    assert_eq!(r.resolve(me), Identity::Operator);
    assert_eq!(r.resolve(daemon_child), Identity::Unknown, "daemon's child");
    assert_eq!(r.resolve(daemon.pid()), Identity::Unknown, "the daemon");
    assert_eq!(r.resolve(0), Identity::Unknown, "pid 0");
    assert_eq!(r.resolve(1), Identity::Operator, "init");

    let mut live = r.live_pids(CHILD);
    live.sort_unstable();
    for p in [keeper.pid(), orphan, setsid, unshare, in_ns] {
        assert!(live.contains(&p), "{p} in live_pids {live:?}");
    }
    assert!(!live.contains(&sleeper.pid()));
    assert!(r.live_pids(ROOT).is_empty());

    // A smith's process cannot be re-bound to another smith.
    assert!(matches!(
        r.bind(orphan, ROOT),
        Err(IdentityError::AlreadyBound { .. })
    ));
    assert!(matches!(
        r.bind(sleeper.pid(), SmithIdx(9)),
        Err(IdentityError::UnknownSmith(_))
    ));

    // Binding an operator process changes its identity at once (cache invalidated).
    assert_eq!(r.resolve(sleeper.pid()), Identity::Operator);
    r.bind(sleeper.pid(), ROOT).expect("bind sleeper");
    assert_eq!(r.resolve(sleeper.pid()), Identity::Smith(ROOT));

    r.kill_smith(CHILD, libc::SIGKILL).expect("kill smith");
    poll_until("smith-001 to die", || {
        r.live_pids(CHILD).is_empty().then_some(())
    });
    drop(engine);
    drop(daemon);
}

#[test]
fn bound_tree_ancestry() {
    bound_tree(IdentityMode::Ancestry);
}

#[test]
fn bound_tree_cgroup() {
    bound_tree(IdentityMode::Cgroup);
}

/// `clone3` with `set_tid = [pid]`: a new process with exactly that pid running `sleep 600`.
fn spawn_with_pid(pid: u32) -> std::io::Result<u32> {
    let sleep = CString::new("/bin/sleep").expect("cstr");
    let arg = CString::new("600").expect("cstr");
    let argv = [sleep.as_ptr(), arg.as_ptr(), std::ptr::null()];
    let tid: libc::pid_t = pid as libc::pid_t;
    // SAFETY: zeroed clone_args is the all-defaults value.
    let mut args: libc::clone_args = unsafe { std::mem::zeroed() };
    args.exit_signal = libc::SIGCHLD as u64;
    args.set_tid = &tid as *const libc::pid_t as u64;
    args.set_tid_size = 1;
    // SAFETY: clone3 without CLONE_VM behaves like fork; the child only calls execv and _exit
    // (async-signal-safe) on memory prepared before the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &mut args as *mut libc::clone_args,
            std::mem::size_of::<libc::clone_args>(),
        )
    };
    if rc == 0 {
        // SAFETY: in the child: exec or exit, nothing else.
        unsafe {
            libc::execv(sleep.as_ptr(), argv.as_ptr());
            libc::_exit(127);
        }
    }
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(rc as u32)
}

fn pid_reuse(mode: IdentityMode) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tempdir");
    let (daemon, _) = fake_daemon(tmp.path());
    let Some(engine) = engine(mode, daemon.pid()) else {
        return;
    };
    let r = &engine.0;
    let victim = Proc::spawn(Command::new("sleep").arg("600"));
    let pid = victim.pid();
    r.bind(pid, ROOT).expect("bind");
    assert_eq!(r.resolve(pid), Identity::Smith(ROOT));
    assert_eq!(r.cache_len(), 1);
    drop(victim); // killed and reaped: the pid is free
    let again = spawn_with_pid(pid).expect("clone3 with set_tid (needs root)");
    let _guard = Pids(vec![again]);
    assert_eq!(again, pid, "the pid was recycled");
    assert_eq!(
        r.resolve(pid),
        Identity::Operator,
        "a recycled pid must not inherit the smith"
    );
    assert!(
        r.live_pids(ROOT).is_empty(),
        "the new process is not the smith's"
    );
    drop(engine);
    drop(daemon);
}

#[test]
fn pid_reuse_ancestry() {
    pid_reuse(IdentityMode::Ancestry);
}

#[test]
fn pid_reuse_cgroup() {
    pid_reuse(IdentityMode::Cgroup);
}

#[test]
fn cache_is_bounded_and_threads_resolve() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tempdir");
    let (daemon, _) = fake_daemon(tmp.path());
    let engine = engine(IdentityMode::Ancestry, daemon.pid()).expect("ancestry");
    let r = &engine.0;
    assert_eq!(r.mode(), Effective::Ancestry);
    r.set_cache_capacity(4);
    let (tx, rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let done_rx = std::sync::Arc::new(Mutex::new(done_rx));
    let mut threads = Vec::new();
    for _ in 0..8 {
        let tx = tx.clone();
        let done = std::sync::Arc::clone(&done_rx);
        threads.push(std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tx.send(unsafe { libc::gettid() } as u32).expect("send");
            let _ = done.lock().map(|d| d.recv());
        }));
    }
    let tids: Vec<u32> = (0..8).map(|_| rx.recv().expect("tid")).collect();
    for &t in &tids {
        assert_eq!(r.resolve(t), Identity::Operator, "thread {t}");
    }
    assert!(r.cache_len() <= 4, "cache holds {}", r.cache_len());
    drop(done_tx);
    for t in threads {
        let _ = t.join();
    }
    drop(engine);
    drop(daemon);
}

#[test]
fn auto_picks_cgroup_when_it_can_and_cleans_up() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tempdir");
    let (daemon, _) = fake_daemon(tmp.path());
    let engine = engine(IdentityMode::Auto, daemon.pid()).expect("auto");
    let r = &engine.0;
    let parent: Option<PathBuf> = r.cgroup_parent().map(Path::to_path_buf);
    match r.mode() {
        Effective::Cgroup => {
            let p = parent.expect("parent");
            assert!(p.ends_with(format!("smithfs-{}", daemon.pid())));
            assert!(p.join("smith-root/smith-001/self").is_dir());
            assert!(p.join("operator").is_dir());
            assert!(r.smith_cgroup(CHILD).is_some());
        }
        Effective::Ancestry => {
            assert!(parent.is_none());
            assert!(r.smith_cgroup(CHILD).is_none());
        }
    }
    assert!(matches!(
        r.register_smith(SmithIdx(5), "smith-root/x"),
        Err(IdentityError::BadFullId(_))
    ));
    assert!(matches!(
        r.register_smith(SmithIdx(5), "smith-root"),
        Err(IdentityError::Conflict { .. })
    ));
    r.register_smith(ROOT, "smith-root").expect("idempotent");
    drop(engine);
    drop(daemon);
}

/// A smith whose dir was removed: its cgroup stays while a process is in it (which remains
/// that smith, never the operator), and is removed — with its descriptor — once it is empty.
#[test]
fn unregistered_smith_cgroup_goes_once_empty() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tempdir");
    let (daemon, _) = fake_daemon(tmp.path());
    let Some(engine) = engine(IdentityMode::Cgroup, daemon.pid()) else {
        return;
    };
    let r = &engine.0;
    let dir = r.smith_cgroup(CHILD).expect("cgroup").path.clone();
    let mut left = Proc::spawn(Command::new("sleep").arg("600"));
    r.bind(left.pid(), CHILD).expect("bind");
    r.unregister_smith(CHILD);
    assert!(r.smith_cgroup(CHILD).is_none(), "forgotten");
    assert_eq!(r.full_id(CHILD), None);
    assert!(dir.is_dir(), "a cgroup with a process stays");
    assert_eq!(r.retired_len(), 1);
    r.housekeep();
    assert_eq!(r.retired_len(), 1, "still populated");
    assert_eq!(
        r.resolve(left.pid()),
        Identity::Smith(CHILD),
        "a leftover process stays its smith"
    );
    let _ = left.0.kill();
    let _ = left.0.wait();
    poll_until("the emptied cgroup to be removed", || {
        r.housekeep();
        (r.retired_len() == 0).then_some(())
    });
    assert!(!dir.exists(), "{} removed", dir.display());
    // An empty cgroup goes at once; unregistering twice is harmless.
    let root_dir = r.smith_cgroup(ROOT).expect("root cgroup").path.clone();
    r.unregister_smith(ROOT);
    r.unregister_smith(ROOT);
    assert_eq!(r.retired_len(), 0);
    assert!(!root_dir.exists());
    drop(engine);
    drop(daemon);
}

/// The cache keeps pidfds of live callers only: entries of exited processes are dropped by
/// `housekeep`, and by an insertion once the cache has doubled.
#[test]
fn cache_drops_exited_processes() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tempdir");
    let (daemon, _) = fake_daemon(tmp.path());
    let engine = engine(IdentityMode::Ancestry, daemon.pid()).expect("ancestry");
    let r = &engine.0;
    let live = Proc::spawn(Command::new("sleep").arg("600"));
    assert_eq!(r.resolve(live.pid()), Identity::Operator);
    for _ in 0..10 {
        let p = Proc::spawn(Command::new("sleep").arg("600"));
        assert_eq!(r.resolve(p.pid()), Identity::Operator);
    } // each killed and reaped here
    assert_eq!(r.cache_len(), 11);
    r.housekeep();
    assert_eq!(r.cache_len(), 1, "only the live process is left");
    // Without housekeeping: insertions sweep once the cache has grown past SWEEP_MIN and
    // doubled, so dead entries stay bounded.
    let n = smithfs::identity::resolve::SWEEP_MIN * 3;
    for _ in 0..n {
        let p = Proc::spawn(Command::new("sleep").arg("600"));
        let pid = p.pid();
        let _ = r.resolve(pid);
        drop(p);
    }
    assert!(
        r.cache_len() <= 2 * smithfs::identity::resolve::SWEEP_MIN + 1,
        "{} entries after {n} short-lived callers",
        r.cache_len()
    );
    assert_eq!(r.resolve(live.pid()), Identity::Operator);
    drop(live);
    drop(engine);
    drop(daemon);
}
