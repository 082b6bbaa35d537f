//! Shared harness for the integration tests: a `TestMount` guard that mounts a fresh smithfs
//! directory and always unmounts it (even when the test panics), a deadline-bounded
//! `poll_until`, and helpers that run real processes (bash, python3, …) inside the mount.
//!
//! Every test gets its own temp dir, so tests are safe to run in parallel (nextest runs each
//! test in its own process; `cargo test` runs them in threads).

#![allow(dead_code)] // each test binary uses a different subset of the helpers

/// The start of the test agents' sh scripts (a literal, for `concat!`): `publish TEXT` writes
/// `outbox/result.md` atomically; woken for its children, the smith concatenates their results
/// into its own and exits; else the task's first line is read as `cmd arg` and a
/// `case "$cmd" in` is opened, which the test's own directives continue and close.
#[allow(unused_macros)]
macro_rules! agent_prelude {
    () => {
        r#"
publish() { printf '%s\n' "$1" > private/r.md && mv private/r.md outbox/result.md; }
if [ "$SMITH_WAKE" = children ]; then
  cat children/*/outbox/result.md > private/r.md 2>/dev/null
  mv private/r.md outbox/result.md
  exit 0
fi
read -r cmd arg < "$SMITH_TASK_FILE"
case "$cmd" in
"#
    };
}

/// The `split` directive of the test agents (a literal, for `concat!`, after
/// [`agent_prelude`]): one child per further line of the task, that line its task; a failed
/// `mkdir` exits 9.
#[allow(unused_macros)]
macro_rules! agent_split {
    () => {
        r#"split)
  tail -n +2 "$SMITH_TASK_FILE" > private/lines
  n=0
  while read -r line; do n=$((n+1)); mkdir "children/$(printf 'smith-%03d' $n)" || exit 9; done < private/lines
  n=0
  while read -r line; do
    n=$((n+1)); c=$(printf 'smith-%03d' $n)
    printf '%s\n' "$line" > private/t.md; mv private/t.md "children/$c/inbox/task-1.md"
  done < private/lines
  exit 0 ;;
"#
    };
}

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The binary under test.
pub const SMITHFS: &str = env!("CARGO_BIN_EXE_smithfs");

/// How long a mount or unmount may take before the test fails.
pub const MOUNT_DEADLINE: Duration = Duration::from_secs(20);

pub mod launcher;
pub mod msched;
pub mod rel;
pub mod sched;
pub mod user;

/// What a [`poll_until`] condition returns: `bool` (done or not) or `Option<T>` (the value,
/// once there).
pub trait Polled {
    /// What [`poll_until`] returns once done.
    type Out;
    /// `Some` once done.
    fn done(self) -> Option<Self::Out>;
}

impl Polled for bool {
    type Out = ();
    fn done(self) -> Option<()> {
        self.then_some(())
    }
}

impl<T> Polled for Option<T> {
    type Out = T;
    fn done(self) -> Option<T> {
        self
    }
}

/// A deadline for [`poll_until`]: a `Duration`, or whole seconds.
pub trait Within {
    /// The deadline as a duration from now.
    fn duration(self) -> Duration;
}

impl Within for Duration {
    fn duration(self) -> Duration {
        self
    }
}

impl Within for u64 {
    fn duration(self) -> Duration {
        Duration::from_secs(self)
    }
}

/// Poll `cond` until it is done (`true`, or `Some(value)`, which is returned) or `deadline`
/// (from now) passes; panics naming `what` on timeout. Polls every 10 ms: a bounded wait on a
/// condition, never a blind sleep. The one poll of every test helper.
pub fn poll_until<R: Polled>(
    deadline: impl Within,
    what: &str,
    mut cond: impl FnMut() -> R,
) -> R::Out {
    let deadline = deadline.duration();
    let end = Instant::now() + deadline;
    loop {
        if let Some(v) = cond().done() {
            return v;
        }
        if Instant::now() >= end {
            panic!("timed out after {deadline:?} waiting for: {what}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// End this test (as passed, with a message) when `/dev/fuse` cannot be opened: a real mount
/// is impossible here. nextest runs each test in its own process, so only this test ends.
pub fn skip_unless_fuse_usable() {
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        eprintln!("skipped: /dev/fuse cannot be used here ({e}); this test needs a real mount");
        std::process::exit(0);
    }
}

/// The filesystem type and source mounted at exactly `dir` (topmost mount), from mountinfo.
pub fn mount_at(dir: &Path) -> Option<(String, String)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = dir.to_str()?;
    let mut found = None;
    for line in info.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let Some(sep) = f.iter().position(|x| *x == "-") else {
            continue;
        };
        if f.get(4) == Some(&want) {
            found = Some((
                f.get(sep + 1).unwrap_or(&"").to_string(),
                f.get(sep + 2).unwrap_or(&"").to_string(),
            ));
        }
    }
    found
}

/// Is a smithfs mount (live or dead) at `dir`?
pub fn is_smithfs_mounted(dir: &Path) -> bool {
    matches!(mount_at(dir), Some((t, s)) if t.starts_with("fuse") && s == "smithfs")
}

/// Result of a process run: exit status, stdout and stderr as text.
#[derive(Debug)]
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }

    /// Panic with the full output unless the run succeeded; return stdout.
    #[track_caller]
    pub fn expect_ok(self, what: &str) -> String {
        assert!(
            self.ok(),
            "{what}: exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.code,
            self.stdout,
            self.stderr
        );
        self.stdout
    }
}

impl From<Output> for Run {
    fn from(o: Output) -> Self {
        Run {
            code: o.status.code(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

/// Run a command to completion with stdin closed.
pub fn run(cmd: &mut Command) -> Run {
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
        .into()
}

/// A sandboxed probe's identity as tests/fixtures/escapes.sh prints it (`out`): it ran as `uid`,
/// with no capability in any of its five sets and `no_new_privs` (docs/SPEC.md §12); `what`
/// labels the failures.
pub fn check_unprivileged(out: &str, uid: u32, what: &str) {
    assert!(
        out.contains(&format!("\nuid: {uid}\n")),
        "[{what}] not uid {uid}:\n{out}"
    );
    for cap in ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"] {
        assert!(
            out.contains(&format!("{cap} 0000000000000000")),
            "[{what}] {cap} not empty:\n{out}"
        );
    }
    assert!(
        out.contains("NoNewPrivs: 1"),
        "[{what}] no no_new_privs:\n{out}"
    );
}

/// tests/fixtures/escapes.sh's verdict on a sandboxed run (`out`): no route got out (no
/// `ESCAPED` or `MISSING` line) and the probe was [`check_unprivileged`] as `uid` with one
/// group only.
pub fn check_nothing_escaped(out: &str, uid: u32, what: &str) {
    assert!(
        !out.contains("ESCAPED") && !out.contains("MISSING"),
        "[{what}] a sandboxed run got out:\n{out}"
    );
    let groups = out
        .lines()
        .find_map(|l| l.strip_prefix("groups: "))
        .unwrap_or_else(|| panic!("[{what}] no groups line:\n{out}"));
    assert_eq!(groups.split_whitespace().count(), 1, "[{what}] {groups}");
    check_unprivileged(out, uid, what);
}

/// `smithfs ARGS…`.
pub fn smithfs<I, S>(args: I) -> Run
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    run(Command::new(SMITHFS).args(args))
}

/// `smithfs run --mount MOUNT --smith FULL_ID -- ARGV…`, in the mount's root.
pub fn run_as(mount: &Path, full_id: &str, argv: &[&str]) -> Run {
    run(Command::new(SMITHFS)
        .args(["run", "--mount"])
        .arg(mount)
        .args(["--smith", full_id, "--"])
        .args(argv)
        .current_dir(mount))
}

/// `whoami` of smith `full` as `key → value` pairs (read by a process bound to it).
pub fn whoami_of(mount: &Path, full: &str) -> Vec<(String, String)> {
    let who = mount.join(".smithfs/whoami");
    let out = run_as(mount, full, &["cat", &who.to_string_lossy()]).expect_ok("whoami");
    smithfs::cli::whoami::parse_pairs(&out)
}

/// `storage bytes` and `storage inodes` of `full`'s whoami (docs/SPEC.md §7, §8); panics when
/// whoami has no such lines (no quota in force).
pub fn storage_of(mount: &Path, full: &str) -> (u64, u64) {
    let w = whoami_of(mount, full);
    let get = |k: &str| {
        w.iter()
            .find(|(key, _)| key == k)
            .and_then(|(_, v)| v.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {k} in whoami: {w:?}"))
    };
    (get("storage bytes"), get("storage inodes"))
}

/// `bash -c SCRIPT` in `cwd`.
pub fn sh_in(cwd: &Path, script: &str) -> Run {
    run(Command::new("bash")
        .arg("-euo")
        .arg("pipefail")
        .arg("-c")
        .arg(script)
        .current_dir(cwd))
}

/// `python3 -c CODE ARGS…` in `cwd`.
pub fn py_in(cwd: &Path, code: &str, args: &[&str]) -> Run {
    run(Command::new("python3")
        .arg("-c")
        .arg(code)
        .args(args)
        .current_dir(cwd))
}

/// `bash -c SCRIPT` in `cwd` as `uid:gid` with no supplementary groups (via setpriv).
pub fn sh_as(uid: u32, gid: u32, cwd: &Path, script: &str) -> Run {
    run(Command::new("setpriv")
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={gid}"))
        .arg("--clear-groups")
        .arg("--")
        .arg("bash")
        .arg("-euo")
        .arg("pipefail")
        .arg("-c")
        .arg(script)
        .current_dir(cwd))
}

/// How to mount.
#[derive(Debug, Clone, Default)]
pub struct MountOpts {
    /// `--allow-other` (needed when processes of other users use the mount).
    pub allow_other: bool,
    /// `-f`: the FUSE server is a child process of the test instead of a daemon.
    pub foreground: bool,
    /// More `smithfs mount` arguments (e.g. `--no-passthrough`).
    pub extra: Vec<&'static str>,
    /// Environment variables of `smithfs mount` (the daemon inherits them).
    pub env: Vec<(&'static str, &'static str)>,
    /// `sandbox.enabled: false` in config.json before the first mount: for tests of the
    /// filesystem, identity and daemon mechanics whose `smithfs run` programs talk to the test
    /// through host paths a run's view does not contain (docs/SPEC.md §12). The sandbox's own
    /// behaviour is tested on sandboxed mounts (tests/e2e/sandbox*.rs, hardening.rs).
    pub unsandboxed: bool,
}

/// A smithfs directory in a private temp dir, mounted for the guard's lifetime.
///
/// Drop unmounts with `smithfs umount`, falling back to `umount -l`, kills a foreground server
/// that did not exit, and then removes the temp dir, so no mount is left behind even when the
/// test panics.
pub struct TestMount {
    tmp: tempfile::TempDir,
    dir: PathBuf,
    opts: MountOpts,
    child: Option<Child>,
}

impl TestMount {
    /// Init and mount with the defaults (daemon mode, `--allow-other`).
    pub fn new() -> Self {
        Self::with(MountOpts {
            allow_other: true,
            ..MountOpts::default()
        })
    }

    /// Init and mount with the defaults and the sandbox off ([`MountOpts::unsandboxed`]).
    pub fn unsandboxed() -> Self {
        Self::with(MountOpts {
            allow_other: true,
            unsandboxed: true,
            ..MountOpts::default()
        })
    }

    /// Init and mount with `--allow-other --identity MODE` and `env` in `smithfs mount`'s
    /// environment, config.json replaced by `config` (written while unmounted, then mounted
    /// again).
    pub fn with_config(
        config: &serde_json::Value,
        mode: &'static str,
        env: Vec<(&'static str, &'static str)>,
    ) -> Self {
        let mut m = Self::with(MountOpts {
            allow_other: true,
            extra: vec!["--identity", mode],
            env,
            ..MountOpts::default()
        });
        m.umount();
        std::fs::write(m.path().join("config.json"), config.to_string()).expect("config.json");
        m.mount();
        m
    }

    /// Init and mount with `opts`.
    pub fn with(opts: MountOpts) -> Self {
        skip_unless_fuse_usable();
        let tmp = tempfile::Builder::new()
            .prefix("smithfs-test-")
            .tempdir()
            .expect("tempdir");
        // Other users (setpriv tests) must be able to reach the mount.
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let dir = tmp.path().join("m");
        smithfs([OsStr::new("init"), dir.as_os_str()]).expect_ok("smithfs init");
        let mut m = TestMount {
            tmp,
            dir,
            opts,
            child: None,
        };
        if m.opts.unsandboxed {
            m.write_sandbox(serde_json::json!({"enabled": false}));
        }
        m.mount();
        m
    }

    /// Init with more `smithfs init` arguments and mount with `opts`. `prepare` gets the scratch
    /// dir before `init` runs (to make a repository there) and returns the extra arguments
    /// (e.g. `--repo PATH`).
    pub fn with_init(
        opts: MountOpts,
        prepare: impl FnOnce(&Path) -> Vec<std::ffi::OsString>,
    ) -> Self {
        let tmp = tempfile::Builder::new()
            .prefix("smithfs-test-")
            .tempdir()
            .expect("tempdir");
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let dir = tmp.path().join("m");
        let extra = prepare(tmp.path());
        let mut args = vec![
            OsStr::new("init").to_os_string(),
            dir.clone().into_os_string(),
        ];
        args.extend(extra);
        smithfs(&args).expect_ok("smithfs init");
        let mut m = TestMount {
            tmp,
            dir,
            opts,
            child: None,
        };
        if m.opts.unsandboxed {
            m.write_sandbox(serde_json::json!({"enabled": false}));
        }
        m.mount();
        m
    }

    /// The mount point (also the backing store while unmounted).
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The temp dir that holds the mount point (scratch space outside the mount).
    pub fn scratch(&self) -> &Path {
        self.tmp.path()
    }

    /// `mount` argument list for the current options.
    fn mount_args(&self) -> Vec<&OsStr> {
        let mut a = vec![OsStr::new("mount"), self.dir.as_os_str()];
        if self.opts.allow_other {
            a.push(OsStr::new("--allow-other"));
        }
        if self.opts.foreground {
            a.push(OsStr::new("-f"));
        }
        a.extend(self.opts.extra.iter().map(OsStr::new));
        if let Some(t) = test_transport() {
            if !self.opts.extra.iter().any(|e| e.starts_with("--transport")) {
                a.push(OsStr::new("--transport"));
                a.push(OsStr::new(t));
            }
        }
        a
    }

    /// Whether this mount asks for io_uring (then `enable_uring` must be on during its INIT).
    fn wants_uring(&self) -> bool {
        self.mount_args()
            .windows(2)
            .any(|w| w[0] == "--transport" && w[1] == "io-uring")
            || self.opts.extra.contains(&"--transport=io-uring")
    }

    /// Replace the environment the next [`TestMount::mount`] gives `smithfs mount`.
    pub fn set_env(&mut self, env: Vec<(&'static str, &'static str)>) {
        self.opts.env = env;
    }

    /// Mount (again). Daemon mode returns once the mount is live; foreground mode polls for it.
    pub fn mount(&mut self) {
        assert!(!is_smithfs_mounted(&self.dir), "already mounted");
        // io_uring is offered at INIT only while the machine-wide switch is on: hold it on
        // (under its lock) until this mount is live, then put it back.
        let _uring = self.wants_uring().then(UringSwitch::on);
        if self.opts.foreground {
            let child = Command::new(SMITHFS)
                .args(self.mount_args())
                .envs(self.opts.env.iter().copied())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(
                    std::fs::File::create(self.tmp.path().join("foreground.log"))
                        .expect("foreground log"),
                )
                .spawn()
                .expect("spawn smithfs mount -f");
            self.child = Some(child);
            let dir = self.dir.clone();
            poll_until(MOUNT_DEADLINE, "the foreground mount to be live", || {
                if let Some(c) = self.child.as_mut() {
                    if let Ok(Some(st)) = c.try_wait() {
                        let log = std::fs::read_to_string(self.tmp.path().join("foreground.log"))
                            .unwrap_or_default();
                        panic!("smithfs mount -f exited early: {st}\n{log}");
                    }
                }
                is_smithfs_mounted(&dir) && std::fs::metadata(&dir).is_ok()
            });
        } else {
            run(Command::new(SMITHFS)
                .args(self.mount_args())
                .envs(self.opts.env.iter().copied()))
            .expect_ok("smithfs mount");
            assert!(
                is_smithfs_mounted(&self.dir),
                "smithfs mount returned but nothing is mounted at {}",
                self.dir.display()
            );
        }
    }

    /// Unmount with `smithfs umount`, check it worked, and wait (bounded) for the old server to
    /// exit, so that a following `mount` does not race with it (`umount_then_mount_again_at_once`
    /// tests that `smithfs umount` itself waits).
    pub fn umount(&mut self) {
        let old = self.daemon_pid();
        smithfs([OsStr::new("umount"), self.dir.as_os_str()]).expect_ok("smithfs umount");
        assert!(!is_smithfs_mounted(&self.dir), "still mounted after umount");
        self.reap_child();
        if let Some(pid) = old {
            poll_until(MOUNT_DEADLINE, "the old daemon to exit", || {
                process_gone(pid)
            });
        }
    }

    /// Unmount, set the mount-wide `config.json`'s `sandbox` to `sandbox` (a JSON object), and
    /// mount again (docs/SPEC.md §12).
    pub fn set_sandbox(&mut self, sandbox: serde_json::Value) {
        self.umount();
        self.write_sandbox(sandbox);
        self.mount();
    }

    /// Set config.json's `sandbox` to `sandbox` (while unmounted).
    fn write_sandbox(&self, sandbox: serde_json::Value) {
        let path = self.dir.join("config.json");
        let mut cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("config.json"))
                .expect("config.json is JSON");
        cfg["sandbox"] = sandbox;
        std::fs::write(&path, serde_json::to_string_pretty(&cfg).expect("json")).expect("write");
    }

    /// Unmount and mount again (a daemon restart).
    pub fn remount(&mut self) {
        self.umount();
        self.mount();
    }

    /// Wait (bounded) for a foreground server to exit after the unmount; kill it if it does not.
    fn reap_child(&mut self) {
        if let Some(mut c) = self.child.take() {
            let end = Instant::now() + MOUNT_DEADLINE;
            while Instant::now() < end {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Wait (bounded) for the `-f` server to exit on its own; its exit status.
    pub fn wait_foreground_exit(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("a foreground server");
        let mut status = None;
        poll_until(MOUNT_DEADLINE, "the foreground server to exit", || {
            status = c.try_wait().expect("try_wait");
            status.is_some()
        });
        status.unwrap()
    }

    /// PID of the FUSE server for this mount (the `-f` child, or the daemon found by its
    /// command line).
    pub fn daemon_pid(&self) -> Option<i32> {
        if let Some(c) = &self.child {
            return Some(c.id() as i32);
        }
        find_daemon(&self.dir)
    }

    /// `bash -c SCRIPT` with the mount as working directory.
    pub fn sh(&self, script: &str) -> Run {
        sh_in(&self.dir, script)
    }

    /// `bash -c SCRIPT` in the mount; panics unless it succeeds; returns stdout.
    #[track_caller]
    pub fn sh_ok(&self, script: &str) -> String {
        self.sh(script).expect_ok(script)
    }

    /// `python3 -c CODE ARGS…` with the mount as working directory.
    pub fn py(&self, code: &str, args: &[&str]) -> Run {
        py_in(&self.dir, code, args)
    }

    /// Like `py`, panicking unless it succeeds; returns stdout.
    #[track_caller]
    pub fn py_ok(&self, code: &str, args: &[&str]) -> String {
        self.py(code, args).expect_ok(code)
    }
}

/// Has process `pid` finished exiting — all its threads gone, so its descriptors are closed?
/// (A multi-threaded process's leader shows as a zombie while other threads still exit.)
pub fn process_gone(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    let zombie = stat.contains(") Z ") || stat.contains(") X ");
    let threads = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.count())
        .unwrap_or(0);
    zombie && threads <= 1
}

/// The host pid of the process that is `ns_pid` in the pid namespace of `init` (a sandboxed
/// run's init, by its host pid: docs/SPEC.md §12), or `ns_pid` itself when `init` shares the
/// test's pid namespace (the run is not sandboxed). `None` when no such process is alive.
pub fn host_pid_in(init: i32, ns_pid: i32) -> Option<i32> {
    let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok();
    let theirs = ns(&init.to_string())?;
    if ns("self") == Some(theirs.clone()) {
        return Some(ns_pid);
    }
    for p in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = p.file_name();
        let Some(pid) = name.to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if ns(&pid.to_string()).as_ref() != Some(&theirs) {
            continue;
        }
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let inner = status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|n| n.parse::<i32>().ok());
        if inner == Some(ns_pid) {
            return Some(pid);
        }
    }
    None
}

/// Run `n` of the smith dir `smith_dir` (mount-relative) once its `meta.json` has an `end`
/// (polled for up to `secs` seconds): its `messages.log` and `meta.json`.
pub fn ended_run(m: &TestMount, smith_dir: &str, n: u32, secs: u64) -> (String, serde_json::Value) {
    let dir = m
        .path()
        .join(smith_dir)
        .join(format!("conversations/run-{n:04}"));
    let meta = poll_until(Duration::from_secs(secs), "the run to end", || {
        let text = std::fs::read_to_string(dir.join("meta.json")).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        (!v["end"].is_null()).then_some(v)
    });
    let log = std::fs::read_to_string(dir.join("messages.log")).unwrap_or_default();
    (log, meta)
}

/// The daemon serving `dir`, found by its command line (`smithfs mount DIR …`).
pub fn find_daemon(dir: &Path) -> Option<i32> {
    let want = dir.as_os_str().as_encoded_bytes();
    for p in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(cmd) = std::fs::read(p.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
        let is_smithfs = args
            .first()
            .is_some_and(|a| a.ends_with(b"smithfs") || a.ends_with(b"/smithfs"));
        if is_smithfs && args.get(1) == Some(&&b"mount"[..]) && args.get(2) == Some(&want) {
            return Some(pid);
        }
    }
    None
}

impl Drop for TestMount {
    fn drop(&mut self) {
        if is_smithfs_mounted(&self.dir) {
            let r = smithfs([OsStr::new("umount"), self.dir.as_os_str()]);
            if !r.ok() || is_smithfs_mounted(&self.dir) {
                eprintln!(
                    "TestMount: smithfs umount failed ({:?}: {}); falling back to umount -l",
                    r.code,
                    r.stderr.trim()
                );
                let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
            }
            if is_smithfs_mounted(&self.dir) {
                let _ = Command::new("fusermount3")
                    .arg("-uz")
                    .arg(&self.dir)
                    .status();
            }
        }
        if let Some(pid) = self.daemon_pid() {
            // The server should exit by itself once unmounted; give it a bounded time.
            let end = Instant::now() + Duration::from_secs(5);
            // SAFETY: signal 0 only probes for existence.
            while Instant::now() < end && unsafe { libc::kill(pid, 0) } == 0 {
                if let Some(c) = self.child.as_mut() {
                    if let Ok(Some(_)) = c.try_wait() {
                        break;
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            // SAFETY: plain kill of a process this guard started (directly or as the daemon).
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }
}

/// One entry of a `snapshot`: type char ('f', 'd', 'l', 'o'), mode bits, size (0 for
/// directories), and content (files) or target (symlinks) as length + FNV-1a hash.
pub type SnapEntry = (char, u32, u64, (usize, u64));

fn fnv(data: &[u8]) -> (usize, u64) {
    let h = data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    });
    (data.len(), h)
}

/// An inode-free view of the tree under `root`, for comparing before/after: relative path →
/// entry. `skip_root` names root-level entries to leave out (with everything under them).
pub fn snapshot_without(
    root: &Path,
    skip_root: &[&str],
) -> std::collections::BTreeMap<String, SnapEntry> {
    use std::os::unix::fs::MetadataExt;
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in
            std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            if dir == root && skip_root.contains(&rel.as_str()) {
                continue;
            }
            let md = std::fs::symlink_metadata(&p).unwrap();
            let ft = md.file_type();
            let (t, data) = if ft.is_symlink() {
                (
                    'l',
                    std::fs::read_link(&p)
                        .unwrap()
                        .into_os_string()
                        .into_encoded_bytes(),
                )
            } else if ft.is_dir() {
                stack.push(p.clone());
                ('d', Vec::new())
            } else if ft.is_file() {
                ('f', std::fs::read(&p).unwrap())
            } else {
                ('o', Vec::new())
            };
            let size = if ft.is_dir() { 0 } else { md.size() };
            out.insert(rel, (t, md.mode() & 0o7777, size, fnv(&data)));
        }
    }
    out
}

/// `snapshot_without(root, &[])`.
pub fn snapshot(root: &Path) -> std::collections::BTreeMap<String, SnapEntry> {
    snapshot_without(root, &[])
}

/// What the store holds as files: a mount's root seen through the mount minus the virtual
/// control directory `.smithfs/` (docs/SPEC.md §7, never stored), or the backing store minus
/// `.smithfs-state/` (never visible).
pub fn store_view(root: &Path) -> std::collections::BTreeMap<String, SnapEntry> {
    snapshot_without(root, &[".smithfs", ".smithfs-state"])
}

/// Serialise tests that change `/dev/fuse`'s mode, across processes (nextest) and threads.
pub struct DevFuseLock {
    _file: std::fs::File,
}

impl DevFuseLock {
    pub fn acquire() -> Self {
        DevFuseLock {
            _file: lock_file("/tmp/smithfs-tests-dev-fuse.lock"),
        }
    }
}

/// `flock(LOCK_EX)` on the file at `path` (created if missing), blocking until granted; the lock
/// lasts as long as the returned file. Serialises tests across nextest processes and threads.
pub fn lock_file(path: &str) -> std::fs::File {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .expect("open lock file");
    // SAFETY: flock on a descriptor we own; blocks until granted, released when `f` closes.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(rc, 0, "flock {path}: {}", std::io::Error::last_os_error());
    f
}

/// Grants world read/write on `/dev/fuse` while alive and restores the original mode on drop.
/// Holds the `DevFuseLock` for its whole lifetime.
pub struct DevFuseGrant {
    original: u32,
    _lock: DevFuseLock,
}

impl DevFuseGrant {
    pub fn new() -> Self {
        let lock = DevFuseLock::acquire();
        let original = std::fs::metadata("/dev/fuse")
            .expect("stat /dev/fuse")
            .permissions()
            .mode()
            & 0o7777;
        std::fs::set_permissions("/dev/fuse", std::fs::Permissions::from_mode(0o666))
            .expect("chmod /dev/fuse");
        DevFuseGrant {
            original,
            _lock: lock,
        }
    }
}

impl Drop for DevFuseGrant {
    fn drop(&mut self) {
        if let Err(e) =
            std::fs::set_permissions("/dev/fuse", std::fs::Permissions::from_mode(self.original))
        {
            eprintln!(
                "DevFuseGrant: cannot restore /dev/fuse mode {:o}: {e}",
                self.original
            );
        }
    }
}

/// The transport the suite runs its mounts over: `SMITHFS_TEST_TRANSPORT` (`io-uring`,
/// `dev-fuse`, `auto`), or the mount's default when unset.
pub fn test_transport() -> Option<&'static str> {
    match std::env::var("SMITHFS_TEST_TRANSPORT").ok()?.as_str() {
        "io-uring" => Some("io-uring"),
        "dev-fuse" => Some("dev-fuse"),
        "auto" => Some("auto"),
        other => panic!("SMITHFS_TEST_TRANSPORT={other}: expected io-uring, dev-fuse or auto"),
    }
}

/// After the daemon behind `path` was killed, wait (bounded) until `probe` fails with ENOTCONN;
/// before that it may fail with ECONNABORTED or ECANCELED (over io_uring, while the kernel
/// tears the rings down: docs/PROTOCOL-NOTES.md U3), never succeed or fail otherwise.
pub fn wait_enotconn(mut probe: impl FnMut() -> std::io::Result<()>) {
    poll_until(Duration::from_secs(10), "ENOTCONN", || {
        let err = probe().expect_err("a dead mount answered");
        let e = err.raw_os_error();
        assert!(
            matches!(
                e,
                Some(libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED)
            ),
            "{err}"
        );
        e == Some(libc::ENOTCONN)
    });
}

/// The lock every [`UringSwitch`] holds.
pub const URING_LOCK: &str = "/tmp/smithfs-tests-enable-uring.lock";

/// `enable_uring` as it rests when no test holds the switch (read under its lock).
pub fn uring_resting_value() -> Option<String> {
    let _lock = lock_file(URING_LOCK);
    std::fs::read_to_string(ENABLE_URING).ok()
}

/// `/sys/module/fuse/parameters/enable_uring`, machine-wide.
pub const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Turns the machine-wide `enable_uring` on while alive and restores the value it found on
/// drop, under a file lock so that two holders (across nextest processes) never overlap.
pub struct UringSwitch {
    original: Option<String>,
    _file: std::fs::File,
}

impl UringSwitch {
    /// Take the lock and switch io_uring on; panics when the kernel has no such parameter.
    pub fn on() -> Self {
        Self::set("1")
    }

    /// Take the lock and switch io_uring off.
    pub fn off() -> Self {
        Self::set("0")
    }

    fn set(value: &str) -> Self {
        let f = lock_file(URING_LOCK);
        let original = std::fs::read_to_string(ENABLE_URING)
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|e| {
                panic!("{ENABLE_URING}: {e} (kernel without CONFIG_FUSE_IO_URING?)")
            });
        std::fs::write(ENABLE_URING, value).expect("set enable_uring");
        UringSwitch {
            original: Some(original),
            _file: f,
        }
    }

    /// Whether the kernel can do FUSE over io_uring at all.
    pub fn available() -> bool {
        std::path::Path::new(ENABLE_URING).exists()
    }

    /// Whether a test can mount over FUSE over io_uring here (root, and a kernel that has it);
    /// says on stderr why not (the test then passes as skipped).
    pub fn usable() -> bool {
        let ok = is_root() && Self::available();
        if !ok {
            eprintln!("skipped: needs root and a kernel with CONFIG_FUSE_IO_URING");
        }
        ok
    }
}

impl Drop for UringSwitch {
    fn drop(&mut self) {
        if let Some(v) = self.original.take() {
            let v = if matches!(v.as_str(), "Y" | "y" | "1") {
                "1"
            } else {
                "0"
            };
            if let Err(e) = std::fs::write(ENABLE_URING, v) {
                eprintln!("UringSwitch: cannot restore {ENABLE_URING} to {v}: {e}");
            }
        }
    }
}

/// Is this process root?
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The cgroups under the `smithfs-PID` parent cgroup of the daemon `pid` (cgroup identity
/// mode), sorted: `operator`, and each smith node (nested as `smith-root/smith-001/…`, each with
/// its `self/` leaf) named by its full id with `/` → `.` (`smith-root.smith-001`); empty when
/// there is none (ancestry mode, no cgroup2).
pub fn daemon_cgroup_names(pid: i32) -> Vec<String> {
    use smithfs::sys::{cgroup, procfs};
    fn walk(dir: &std::path::Path, prefix: &str, out: &mut Vec<String>) {
        let Ok(d) = std::fs::read_dir(dir) else {
            return;
        };
        for e in d.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let name = e.file_name().to_string_lossy().into_owned();
            if name == "self" {
                continue;
            }
            let full = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}.{name}")
            };
            out.push(full.clone());
            if full != "operator" {
                walk(&e.path(), &full, out);
            }
        }
    }
    let (Ok(mounts), Ok(own)) = (
        std::fs::read("/proc/self/mountinfo"),
        std::fs::read(format!("/proc/{pid}/cgroup")),
    ) else {
        return Vec::new();
    };
    let (Ok(mounts), Ok(own)) = (procfs::parse_mountinfo(&mounts), procfs::parse_cgroup(&own))
    else {
        return Vec::new();
    };
    let Some(dir) = cgroup::own_cgroup_dir(&mounts, &own) else {
        return Vec::new();
    };
    let mut names = Vec::new();
    walk(&dir.join(format!("smithfs-{pid}")), "", &mut names);
    names.sort();
    names
}

/// A process (`sleep 120`) with its working directory in `dir/smiths`, keeping a mount busy;
/// killed and reaped on drop.
pub struct Holder(Child);

impl Holder {
    /// Start the holder in `dir/smiths` (a mount point).
    pub fn new(dir: &Path) -> Holder {
        let c = Command::new("sleep")
            .arg("120")
            .current_dir(dir.join("smiths"))
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn sleep");
        Holder(c)
    }

    /// The holder's pid.
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
